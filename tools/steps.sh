# Sourced by the GPU scripts (gpu_check.sh, deepgemm_on_gpu.sh, topk_package_ab.sh): one
# way to run a step, to judge the steps, to install a packed build and to spread pytest.
# step needs OUT (the output folder); it fills the associative array STATUS.
declare -A STATUS

step() {  # step NAME LOG CMD...: run CMD with output in OUT/LOG, record its exit code
  local name="$1" log="$2"; shift 2
  local t0=$SECONDS
  echo "== $name" | tee -a "$OUT/$log"
  "$@" >>"$OUT/$log" 2>&1
  STATUS[$name]=$?
  echo "== $name: exit ${STATUS[$name]} after $((SECONDS - t0)) s" | tee -a "$OUT/$log"
}

steps_passed() {  # exit status 0 when every step recorded in STATUS exited 0
  local name
  for name in "${!STATUS[@]}"; do
    [ "${STATUS[$name]}" = 0 ] || return 1
  done
}

install_packed() {  # install_packed DIR PKG.tar.xz: what tools/pack_prebuilt.sh packed, into DIR
  rm -rf "$1"/dsa_ext "$1"/dsa_ext-*.dist-info && mkdir -p "$1" && tar -xJvf "$2" -C "$1"
}

# pytest-xdist's arguments for PYTHON (default python3): half the cores, at most 8, as
# workers (on the H100 machine's 16 cores, 8 workers ran the 728 CUDA tests in 35 s, each
# worker's CPU references on its share of the cores: RESULTS.md, thirty-third session);
# nothing without xdist or below 2 workers.
xdist_args() {
  local workers=$(( $(nproc) / 2 < 8 ? $(nproc) / 2 : 8 ))
  "${1:-python3}" -c "import xdist" 2>/dev/null && [ "$workers" -ge 2 ] && echo "-n $workers"
  return 0
}
