# The helpers every side of `make bench` measures through: sourced by bench/torch_env.sh (so
# by run.sh and quality.sh), bench/ct2_bench.sh and bench/torch2.sh run alone. result reads RES
# (the results file), LOGS (the runs' stderr) and START (the run's start, in seconds).

# field JSON NAME: the numeric field NAME of a RESULT line's JSON.
field() { sed -n "s/.*\"$2\": *\\([0-9.eE+-]*\\).*/\\1/p" <<<"$1"; }

# result SIDE CMD...: runs one measurement process and appends its RESULT line to RES as
# "SIDE {json}"; a run without one is reported (its stderr is in LOGS) and skipped.
result() {
  local side=$1; shift
  local line
  if ! line=$("$@" 2>>"$LOGS" | grep '^RESULT ' | tail -1); then
    echo "bench: FAILED: $* (see $LOGS)" >&2
    return 0
  fi
  echo "$side ${line#RESULT }" >>"$RES"
  echo "  [$(( $(date +%s) - START ))s] $side $*: ${line#RESULT }" | cut -c1-220 >&2
}

# cached_peer_differs SIDE WHAT CONFIG [MATCH]: true when SIDE's KV-cached WHAT peer (fp32) decoded
# other ids (CRC) than its nn.Transformer full recomputation for CONFIG in RES; MATCH narrows both
# rows (a regex on the rest of the line, e.g. the eager ones). False when either row is missing.
cached_peer_differs() {
  local side=$1 what=$2 c=$3 match=${4:-} full cached
  full=$(grep "^$side .*\"what\": \"$what\", \"config\": \"$c\"$match" "$RES" | sed -n 's/.*"ids_crc": \([0-9]*\).*/\1/p')
  cached=$(grep "^$side .*\"what\": \"${what}_cached\", \"config\": \"$c\".*\"precision\": \"fp32\"$match" "$RES" |
           sed -n 's/.*"ids_crc": \([0-9]*\).*/\1/p')
  [ -n "$full" ] && [ "$full" != "$cached" ]
}
