#!/usr/bin/env bash
# Runs a private libvirtd + virtlogd (Debian 12's monolithic daemons) without
# systemd, so tests and people can try hvtrace's libvirt backend without
# touching the host's libvirt.
#
#   private-libvirtd.sh start   DIR   start both daemons; prints URI=... SOCKET=...
#   private-libvirtd.sh stop    DIR   destroy its domains' QEMUs, stop both daemons
#   private-libvirtd.sh restart-libvirtd DIR   stop and start libvirtd only (QEMUs keep running)
#   private-libvirtd.sh stop-libvirtd DIR      stop libvirtd only (virtlogd and QEMUs keep running)
#   private-libvirtd.sh start-libvirtd DIR     start libvirtd again after stop-libvirtd
#   private-libvirtd.sh uri     DIR   print the connection URI
#
# Why a mount namespace: as root, libvirtd runs in "system" mode and its
# config, state and run directories are compiled in (/etc/libvirt,
# /var/lib/libvirt, /run/libvirt, ...). The daemons run in their own mount
# namespace in which those directories are bind mounts of DIR/{etc,lib,run,
# log,cache}; the client socket lives in DIR/sock, outside the bind mounts, so
# any process on the host connects with
#   qemu:///system?socket=DIR/sock/libvirt-sock
# virtlogd stays up across a libvirtd restart and anchors the namespace (the
# new libvirtd joins it with nsenter and finds its running domains again).
#
# qemu.conf for a container: QEMU runs as root, no cgroups, no namespaces, no
# security driver; file-backed guest memory goes to DIR/ram (tmpfs when DIR
# is under /dev/shm, else wherever DIR is) - see domain_xml.h.
set -euo pipefail

cmd=${1:-}
dir=${2:-}
if [ -z "$cmd" ] || [ -z "$dir" ]; then
  sed -n '2,14p' "$0" >&2
  exit 2
fi
[ "$(id -u)" -eq 0 ] || { echo "private-libvirtd: must run as root (system-mode libvirtd)" >&2; exit 1; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sock="$dir/sock/libvirt-sock"
uri="qemu:///system?socket=$sock"

log() { echo "private-libvirtd: $*" >&2; }

pid_alive() { [ -n "${1:-}" ] && kill -0 "$1" 2>/dev/null; }
read_pid() { cat "$1" 2>/dev/null || true; }

write_config() {
  mkdir -p "$dir"/{etc/qemu,lib,run,log/qemu,cache,sock,ram}
  cat >"$dir/etc/libvirtd.conf" <<CONF
unix_sock_dir = "$dir/sock"
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:$dir/log/libvirtd.log"
CONF
  cat >"$dir/etc/virtlogd.conf" <<CONF
log_outputs = "3:file:$dir/log/virtlogd.log"
CONF
  cat >"$dir/etc/qemu.conf" <<CONF
user = "root"
group = "root"
dynamic_ownership = 0
cgroup_controllers = [ ]
namespaces = [ ]
security_driver = "none"
memory_backing_dir = "$dir/ram"
CONF
}

# Runs "$@" inside the daemons' mount namespace (a new one when virtlogd is not running).
in_namespace() {
  local anchor
  anchor=$(read_pid "$dir/virtlogd.pid")
  if pid_alive "$anchor"; then
    nsenter --mount="/proc/$anchor/ns/mnt" -- "$@"
  else
    unshare --mount --propagation private -- sh -c '
      d=$1; shift
      mkdir -p /run/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt /etc/libvirt
      mount --bind "$d/etc" /etc/libvirt
      mount --bind "$d/run" /run/libvirt
      mount --bind "$d/lib" /var/lib/libvirt
      mount --bind "$d/log" /var/log/libvirt
      mount --bind "$d/cache" /var/cache/libvirt
      exec "$@"' sh "$dir" "$@"
  fi
}

start_libvirtd() {
  in_namespace libvirtd --daemon --config "$dir/etc/libvirtd.conf" --pid-file "$dir/libvirtd.pid"
  local i
  for i in $(seq 1 200); do
    if [ -S "$sock" ] && virsh -q -c "$uri" version >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  log "libvirtd did not answer on $sock within 20 s; log tail:"
  tail -n 20 "$dir/log/libvirtd.log" >&2 || true
  return 1
}

stop_pidfile() {
  local f=$1 pid i
  pid=$(read_pid "$f")
  pid_alive "$pid" || { rm -f "$f"; return 0; }
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do pid_alive "$pid" || break; sleep 0.1; done
  pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  rm -f "$f"
}

case "$cmd" in
  start)
    if pid_alive "$(read_pid "$dir/libvirtd.pid")"; then
      log "already running in $dir"
    else
      write_config
      # virtlogd first: it creates the namespace the libvirtd joins.
      in_namespace virtlogd --daemon --config "$dir/etc/virtlogd.conf" --pid-file "$dir/virtlogd.pid"
      for _ in $(seq 1 50); do pid_alive "$(read_pid "$dir/virtlogd.pid")" && break; sleep 0.1; done
      pid_alive "$(read_pid "$dir/virtlogd.pid")" || { log "virtlogd did not start"; exit 1; }
      start_libvirtd
    fi
    echo "URI=$uri"
    echo "SOCKET=$sock"
    ;;
  restart-libvirtd)
    stop_pidfile "$dir/libvirtd.pid"
    start_libvirtd
    ;;
  stop-libvirtd)
    stop_pidfile "$dir/libvirtd.pid"
    ;;
  start-libvirtd)
    pid_alive "$(read_pid "$dir/virtlogd.pid")" || { log "virtlogd is not running in $dir: use start"; exit 1; }
    pid_alive "$(read_pid "$dir/libvirtd.pid")" || start_libvirtd
    ;;
  stop)
    # QEMUs outlive libvirtd (that is how libvirt works), so destroy them first.
    if pid_alive "$(read_pid "$dir/libvirtd.pid")"; then
      for d in $(virsh -q -c "$uri" list --name 2>/dev/null); do
        virsh -q -c "$uri" destroy "$d" >/dev/null 2>&1 || true
      done
    fi
    # Whatever is left (libvirtd already dead): QEMUs whose pid files are ours.
    for f in "$dir"/run/qemu/*.pid; do
      [ -e "$f" ] || continue
      pid=$(read_pid "$f")
      pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    done
    stop_pidfile "$dir/libvirtd.pid"
    stop_pidfile "$dir/virtlogd.pid"
    ;;
  uri)
    echo "$uri"
    ;;
  *)
    log "unknown command '$cmd'"
    exit 2
    ;;
esac
