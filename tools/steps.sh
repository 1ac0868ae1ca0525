# Sourced by the GPU scripts (gpu_check.sh, deepgemm_on_gpu.sh): one way to run a step.
# Needs OUT (the output folder); fills the associative array STATUS.
declare -A STATUS

step() {  # step NAME LOG CMD...: run CMD with output in OUT/LOG, record its exit code
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS
  echo "== $name" | tee -a "$OUT/$log"
  "$@" >>"$OUT/$log" 2>&1
  STATUS[$name]=$?
  echo "== $name: exit ${STATUS[$name]} after $((SECONDS - t0)) s" | tee -a "$OUT/$log"
}
