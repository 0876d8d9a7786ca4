# Sourced (from the repository root) by the scripts that run on the GPU machine. A device call
# carries at most 64 MiB and the whole .device-pack is more (~67 MB with FlashInfer's baseline),
# so scripts/gpu_check.sh also writes it as .device-pack.tar.xz (~21 MB), which is what a call
# carries. Unpacked here into .device-pack where there is none, or where the one there came
# from an older archive (a later call's carry); a .device-pack carried as a directory (no
# .unpacked stamp) is left as it is, and a second script in the same call finds it unpacked.
if [[ -f .device-pack.tar.xz ]] &&
   { [[ ! -d .device-pack ]] || { [[ -f .device-pack/.unpacked ]] && [[ .device-pack.tar.xz -nt .device-pack/.unpacked ]]; }; }; then
  rm -rf .device-pack
  tar -xJf .device-pack.tar.xz
  touch .device-pack/.unpacked
fi
