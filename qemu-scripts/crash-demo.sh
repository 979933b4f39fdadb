#!/usr/bin/env bash
# One command to see hvtrace's raw material: boots a test guest under QEMU
# with pvpanic and QMP (and, on 6.12, a host-backed boot range holding the
# kernel's persistent ring buffer), waits for the guest, writes a trace marker,
# crashes the guest with sysrq and prints the QMP events QEMU sent with their
# times. QEMU and every temporary file are removed at the end.
#
#   qemu-scripts/crash-demo.sh [--kernel 6.12|6.1] [--smp N] [--accel auto|kvm|tcg] [--keep]
#
# --keep leaves the run directory (console log, QEMU log, a copy of the boot
# range) and prints its path. Builds the guest images first when needed
# (qemu-scripts/build-guest.sh, fast when cached).
set -euo pipefail
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

guest=6.12
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    --kernel)
      [ $# -ge 2 ] || { echo "crash-demo: --kernel needs 6.12 or 6.1" >&2; exit 2; }
      guest=$2; shift 2 ;;
    --smp) [ $# -ge 2 ] || { echo "crash-demo: --smp needs a number" >&2; exit 2; }
      pass+=(--smp "$2"); shift 2 ;;
    --keep) pass+=(--keep); shift ;;
    --accel) [ $# -ge 2 ] || { echo "crash-demo: --accel needs auto, kvm or tcg" >&2; exit 2; }
      pass+=(--accel "$2"); shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "crash-demo: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$guest" in 6.12|6.1) ;; *) echo "crash-demo: --kernel takes 6.12 or 6.1" >&2; exit 2 ;; esac
for tool in qemu-system-x86_64 python3; do
  command -v "$tool" >/dev/null || { echo "crash-demo: '$tool' is missing; run scripts/install-deps.sh" >&2; exit 1; }
done

line=$("$SCRIPT_DIR/build-guest.sh" --kernel "$guest" | grep "^GUEST $guest ")
kernel=$(sed -n 's/.* KERNEL=\([^ ]*\).*/\1/p' <<<"$line")
initrd=$(sed -n 's/.* INITRD=\([^ ]*\).*/\1/p' <<<"$line")
# exec: the Python process owns QEMU and cleans up on exit or signal.
exec python3 "$SCRIPT_DIR/crash_demo.py" --guest "$guest" --kernel-image "$kernel" --initrd "$initrd" "${pass[@]}"
