#!/usr/bin/env bash
# The trainer's experiments (docs/trainer.md): each writes its CSV, JSON and SVG into OUT.
#   examples/rlvr_trainer/experiments.sh BUILD_DIR OUT [a|b|c|d ...]     (default: all four)
# BUILD_DIR holds examples/rlvr_trainer/{rlvr_train,rlvr_plot}; the warm-up checkpoint is OUT/warm.pt
# (made by the first run: 800 supervised steps). Each run uses one intra-op thread.
set -euo pipefail
build=${1:?build dir}; out=${2:?output dir}; shift 2
train="$build/examples/rlvr_trainer/rlvr_train"; plot="$build/examples/rlvr_trainer/rlvr_plot"
mkdir -p "$out"
run() { local name=$1; shift; "$train" --checkpoint "$out/warm.pt" --csv "$out/$name.csv" --json "$out/$name.json" \
          --svg "$out/$name.svg" "$@" | tee "$out/$name.log"; }
for e in "${@:-a b c d}"; do
  case $e in
    a) run default ;;
    b) for k in 1 2 4; do
         run "segments_$k" --segments "$k" --min-target 1 --max-target 999 --max-response 512 --prompts 4 --steps 8 \
             --validate 0 --lengths-out "$out/segments_$k.lengths"
       done
       "$plot" --out "$out/segments.svg" --panel rollout_s=Rollout\ seconds\ per\ step --panel decode_tokens_per_s=Decode\ tokens/s \
         "$out/segments_1.csv=1 segment" "$out/segments_2.csv=2 segments" "$out/segments_4.csv=4 segments" ;;
    c) run mpt_off --mpt off
       run mpt_static --mpt static
       "$plot" --out "$out/mpt.svg" --panel entropy=Entropy --panel validation_accuracy=Validation\ accuracy \
         --panel median_length=Median\ length --panel mpt_masked=MPT-masked\ share\ \(%\) \
         "$out/mpt_off.csv=off" "$out/mpt_static.csv=static" "$out/default.csv=dynamic" ;;
    d) run resets_off --resets off --steps 60
       run resets_on --resets on --steps 60
       "$plot" --out "$out/resets.svg" --markers reset --panel validation_accuracy=Validation\ accuracy --panel kl=KL\ to\ the\ reference --panel entropy=Entropy \
         "$out/resets_off.csv=resets off" "$out/resets_on.csv=resets on" ;;
    *) echo "experiments.sh: unknown experiment '$e' (a, b, c, d)" >&2; exit 2 ;;
  esac
done
