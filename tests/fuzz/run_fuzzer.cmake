# Runs one libFuzzer target as a CTest test (cmake -P run_fuzzer.cmake with -D...):
#   FUZZER       the target's executable
#   TARGET       its name (seeds, regressions and messages are keyed by it)
#   SEEDS        committed seed corpus (may be missing)
#   EXTRA_SEEDS  optional directory whose *.json files are added as seeds (the golden cases)
#   SEEDGEN      optional generator: `SEEDGEN TARGET DIR` writes generated seeds into DIR
#   REGRESSIONS  kept crash inputs (may be missing): each is replayed once before fuzzing
#   WORK         scratch directory in the build tree (corpus copy, artifacts)
#   SECONDS      fuzzing time
#   DICT         optional libFuzzer dictionary
foreach(v FUZZER TARGET WORK SECONDS)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_fuzzer.cmake: -D${v}=... is required")
  endif()
endforeach()
if(NOT EXISTS ${FUZZER})
  message("fuzz target ${TARGET} not built (see the fuzz_configure output): skipped")
  return()
endif()

set(limits -timeout=10 -rss_limit_mb=2048)
# UBSan reports carry a stack (the default prints only the line).
set(ENV{UBSAN_OPTIONS} "print_stacktrace=1:$ENV{UBSAN_OPTIONS}")
set(dict)
if(DEFINED DICT AND EXISTS ${DICT})
  set(dict -dict=${DICT})
endif()
set(corpus ${WORK}/corpus)
set(artifacts ${WORK}/artifacts)
file(REMOVE_RECURSE ${corpus} ${artifacts})
file(MAKE_DIRECTORY ${corpus} ${artifacts})

# 1. Every kept crash is a regression test: replay each on its own, so a failure names the file.
if(DEFINED REGRESSIONS AND IS_DIRECTORY ${REGRESSIONS})
  file(GLOB inputs LIST_DIRECTORIES false ${REGRESSIONS}/*)
  list(FILTER inputs EXCLUDE REGEX "/(README[^/]*|\\.[^/]*)$")
  list(SORT inputs)
  list(LENGTH inputs n)
  message("${TARGET}: replaying ${n} regression input(s) from ${REGRESSIONS}")
  set(failed)
  foreach(input IN LISTS inputs)
    execute_process(COMMAND ${FUZZER} ${limits} ${input} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
    if(NOT rc EQUAL 0)
      message("---- ${input} (exit ${rc}) ----\n${out}")
      list(APPEND failed ${input})
    endif()
  endforeach()
  if(failed)
    list(JOIN failed "\n  " failed_list)
    message(FATAL_ERROR "${TARGET}: regression input(s) fail:\n  ${failed_list}")
  endif()
endif()

# 2. Seeds: committed files, optional extra files, generated ones.
if(DEFINED SEEDS AND IS_DIRECTORY ${SEEDS})
  file(GLOB seeds LIST_DIRECTORIES false ${SEEDS}/*)
  if(seeds)
    file(COPY ${seeds} DESTINATION ${corpus})
  endif()
endif()
if(DEFINED EXTRA_SEEDS AND IS_DIRECTORY ${EXTRA_SEEDS})
  file(GLOB seeds LIST_DIRECTORIES false ${EXTRA_SEEDS}/*.json)
  if(seeds)
    file(COPY ${seeds} DESTINATION ${corpus})
  endif()
endif()
if(DEFINED SEEDGEN AND EXISTS ${SEEDGEN})
  execute_process(COMMAND ${SEEDGEN} ${TARGET} ${corpus} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${TARGET}: seed generator failed (exit ${rc})")
  endif()
endif()
file(GLOB seeds LIST_DIRECTORIES false ${corpus}/*)
list(LENGTH seeds n)
message("${TARGET}: fuzzing ${SECONDS} s from ${n} seed(s) in ${corpus}")

# 3. Fuzz. A crash leaves its input under ${artifacts}; keep it under tests/fuzz/regressions.
# The fuzzer's output goes to ${WORK}/fuzz.log. A log that a runner truncates in the middle keeps
# its end, so on failure the end of this test's output carries what is needed to reproduce: the
# fuzzer's report (from its first line naming the failure) and each input, in hex.
set(log ${WORK}/fuzz.log)
execute_process(COMMAND ${FUZZER} ${limits} -max_total_time=${SECONDS} -print_final_stats=1 ${dict}
                        -artifact_prefix=${artifacts}/ ${corpus}
                OUTPUT_FILE ${log} ERROR_FILE ${log}
                RESULT_VARIABLE rc)
file(READ ${log} text)
if(rc EQUAL 0)
  string(REGEX MATCHALL "(Done [^\n]*|stat::[^\n]*)" summary "${text}")
  list(JOIN summary "\n" summary)
  message("${summary}")
  return()
endif()
string(REGEX MATCH "INFO: Seed: [0-9]+" seed "${text}")
string(REGEX MATCH "==[0-9]+==ERROR|ERROR: libFuzzer|fuzz check failed|runtime error|deadly signal|LeakSanitizer"
       hit "${text}")
string(LENGTH "${text}" size)
if(hit)
  string(FIND "${text}" "${hit}" from)
  string(SUBSTRING "${text}" 0 ${from} before)
  string(FIND "${before}" "\n" line_start REVERSE)  # the report from the start of its line
  math(EXPR from "${line_start} + 1")
  string(SUBSTRING "${text}" ${from} 12000 report)
else()  # no line names the failure: the end of the log
  math(EXPR from "${size} - 6000")
  if(from LESS 0)
    set(from 0)
  endif()
  string(SUBSTRING "${text}" ${from} -1 report)
endif()
string(REPLACE "\n" "\n  " report "  ${report}")  # indented: printed as it is, not re-wrapped
file(GLOB found LIST_DIRECTORIES false ${artifacts}/*)
set(inputs)
foreach(input IN LISTS found)
  file(SIZE ${input} bytes)
  file(READ ${input} hex LIMIT 4096 HEX)
  string(APPEND inputs "  ${input} (${bytes} bytes; hex of the first 4096):\n  ${hex}\n")
endforeach()
message(FATAL_ERROR "${TARGET}: the fuzzer failed (exit ${rc}); its log: ${log} (${seed}), from its report:\n"
                    "${report}\ninput(s):\n${inputs}"
                    "Replay with `${FUZZER} <input>` (the hex above: `xxd -r -p`), minimise with "
                    "`${FUZZER} -minimize_crash=1 -runs=10000 <input>` and keep the result as "
                    "tests/fuzz/regressions/${TARGET}/crash-<what it shows> (see tests/fuzz/README.md).")
