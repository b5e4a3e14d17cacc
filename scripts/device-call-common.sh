# Sourced by the device-tool call scripts (device-bench-call.sh, device-e2e-call.sh), in the
# carried working tree on the GPU machine: device_call_repo W unpacks the release binary where
# it travels stripped and gzipped (carry .dev/bin: strip -o .dev/bin/optimizerd
# target/release/optimizerd && gzip -9 .dev/bin/optimizerd; 9 MB instead of 25 of the 64 MiB a
# call carries), copies the tree to W/repo on the first call (later calls find it there: a
# carried path is replaced each call, /tmp persists while the machine stays warm) and enters it.
device_call_repo() {
  local w=$1
  if [ -f .dev/bin/optimizerd.gz ]; then
    mkdir -p target/release && gunzip -c .dev/bin/optimizerd.gz > target/release/optimizerd && chmod +x target/release/optimizerd
  fi
  [ -d "$w/repo" ] || { cp -r "$PWD" "$w/repo.tmp" && mv "$w/repo.tmp" "$w/repo"; }
  cd "$w/repo" || return 1
}
