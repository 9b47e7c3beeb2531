#!/usr/bin/env bash
# The trainer's experiments (docs/trainer.md): each writes its CSV, JSON and SVG into OUT.
#   examples/rlvr_trainer/experiments.sh BUILD_DIR OUT [a|b|c|d ...]     (default: all four)
# BUILD_DIR holds examples/rlvr_trainer/{rlvr_train,rlvr_plot}; the warm-up checkpoint is OUT/warm.pt
# (made by the first run: 800 supervised steps). Each run uses one intra-op thread. c and d compare
# their runs with the default run of a (OUT/default.csv), so a runs first.
set -euo pipefail
build=${1:?build dir}; out=${2:?output dir}; shift 2
train="$build/examples/rlvr_trainer/rlvr_train"; plot="$build/examples/rlvr_trainer/rlvr_plot"
sim="$build/examples/segment_rollout_sim"; rollout="$build/examples/rlvr_trainer/rlvr_rollout"
mkdir -p "$out"
run() { local name=$1; shift; "$train" --checkpoint "$out/warm.pt" --csv "$out/$name.csv" --json "$out/$name.json" \
          --svg "$out/$name.svg" "$@" | tee "$out/$name.log"; }
for e in ${@:-a b c d}; do
  case $e in
    a) run default ;;
    b) # Segment rollout on the full task (L_max 512), 1 / 2 / 4 segments and the adaptive count, same
       # seeds; then the simulator with the engine's calibrated costs (rlvr_rollout --fit), the 1-segment
       # run's update costs and its released length groups.
       for k in 1 2 4 auto; do
         run "segments_$k" --segments "$k" --min-target 1 --max-target 999 --max-response 512 --prompts 4 --steps 12 \
             --lr 5e-5 --validate 64 --validate-every 4 --lengths-out "$out/segments_$k.lengths"
       done
       "$rollout" --fit --max-response 512 --max-batch 64 | tee "$out/segments_fit.log"
       engine=$(sed -n 's/^cost model (segment_rollout_sim): //p' "$out/segments_fit.log")
       update=$(sed -n 's/^cost model (segment_rollout_sim): .*\(--train-token-us.*\)$/\1/p' "$out/segments_1.log")
       "$sim" --max-tokens 512 --prompts 4 --group-size 8 --capacity 64 --prompt-tokens 4 --warmup 0 --steps 12 \
         --segments 1,2,4,8,auto --length-groups "$out/segments_1.lengths" $engine $update | tee "$out/segments_sim.log"
       "$plot" --out "$out/segments.svg" --panel rollout_s=Rollout\ seconds\ per\ step --panel train_s=Update\ seconds\ per\ step \
         --panel validation_accuracy=Validation\ accuracy --panel segments=Segments \
         "$out/segments_1.csv=1 segment" "$out/segments_2.csv=2 segments" "$out/segments_4.csv=4 segments" \
         "$out/segments_auto.csv=auto" ;;
    c) run mpt_off --mpt off
       run mpt_static --mpt static
       "$plot" --out "$out/mpt.svg" --panel entropy=Entropy --panel validation_accuracy=Validation\ accuracy \
         --panel median_length=Median\ length --panel mpt_masked=MPT-masked\ share\ \(%\) \
         "$out/mpt_off.csv=off" "$out/mpt_static.csv=static" "$out/default.csv=dynamic" ;;
    d) # The default run has resets on; the same run with them off; then both to 300 steps.
       run resets_off --resets off
       "$plot" --out "$out/resets.svg" --markers reset --panel validation_accuracy=Validation\ accuracy --panel kl=KL\ to\ the\ reference --panel entropy=Entropy \
         "$out/resets_off.csv=resets off" "$out/default.csv=resets on (default)"
       run resets_long_off --resets off --steps 300
       run resets_long_on --steps 300
       "$plot" --out "$out/resets_long.svg" --markers reset --panel validation_accuracy=Validation\ accuracy --panel kl=KL\ to\ the\ reference --panel entropy=Entropy \
         "$out/resets_long_off.csv=resets off" "$out/resets_long_on.csv=resets on" ;;
    *) echo "experiments.sh: unknown experiment '$e' (a, b, c, d)" >&2; exit 2 ;;
  esac
done
