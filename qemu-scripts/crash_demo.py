#!/usr/bin/env python3
"""Boots an hvtrace test guest, writes a trace marker, crashes the guest and
prints the QMP events QEMU sent. Run it through crash-demo.sh, which builds the
images first; this file only needs python3's standard library.

The guest follows the contract in qemu-scripts/README.md: it prints
"HVTRACE-GUEST-READY <release>" on ttyS0 and then serves a shell there, so a
command is typed as "CMD; echo __HVT_DONE_<n>_$?" and finished when the line
"__HVT_DONE_<n>_<status>" comes back (the echo of the typed line shows a
literal "$?", so it never matches).

On 6.12 the guest gets a host-backed boot range (DESIGN.md section 4.2): NUMA
node 1 is a file in /dev/shm, the kernel's persistent ring buffer
("trace_instance=boot_map@ADDR:SIZE") lives at its start, and after the crash
the demo reads the buffer's per-CPU metadata and the marker straight from that
file while the guest sits paused.

Every wait has a deadline; QEMU, its sockets, the temporary directory and the
/dev/shm file are removed on every exit path (normal, error, ^C, SIGTERM).
"""

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

MIB = 1 << 20
READY_RE = re.compile(rb"HVTRACE-GUEST-READY (\S+)\r?\n")
BOOT_MAP_MAGIC = 0x0BADFEED


class DemoError(Exception):
    pass


class Clock:
    """Seconds since the demo started, for the printed timeline."""

    def __init__(self):
        self.start = time.monotonic()

    def now(self):
        return time.monotonic() - self.start

    def say(self, text):
        print(f"[{self.now():7.3f} s] {text}", flush=True)


class Serial:
    """Drains the guest console into a log and a buffer. Draining matters: a
    serial client that stops reading makes QEMU's UART stall the guest."""

    def __init__(self, path, log_path, deadline):
        self.sock = connect_unix(path, deadline, "serial console")
        self.log = open(log_path, "wb")
        self.buf = bytearray()
        self.cond = threading.Condition()
        self.closed = False
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            with self.cond:
                if not data:
                    self.closed = True
                    self.cond.notify_all()
                    return
                self.buf += data
                self.log.write(data)
                self.log.flush()
                self.cond.notify_all()

    def wait_for(self, regex, timeout, start=0, what="output"):
        """Returns (match, end offset) of |regex| in the console output after
        |start|, or raises DemoError with the console tail at the deadline."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                m = regex.search(self.buf, start)
                if m:
                    return m, m.end()
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    why = "console closed (QEMU gone?)" if self.closed else f"no {what} within {timeout:.0f} s"
                    raise DemoError(f"{why}; console tail:\n{self.tail()}")
                self.cond.wait(min(left, 0.5))

    def tail(self, lines=15):
        text = bytes(self.buf[-4000:]).decode(errors="replace")
        return "\n".join("    | " + l for l in text.splitlines()[-lines:])

    def run(self, n, command, timeout=30):
        """Types |command| into the guest shell; returns its exit status."""
        with self.cond:
            start = len(self.buf)
        self.sock.sendall(f"{command}; echo __HVT_DONE_{n}_$?\n".encode())
        m, _ = self.wait_for(re.compile(rb"__HVT_DONE_%d_(\d+)" % n), timeout, start, f"end of '{command}'")
        return int(m.group(1))

    def send(self, text):
        self.sock.sendall(text.encode())

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Qmp:
    """A minimal QMP client: one reader thread, replies matched by id, events
    kept with the host time they arrived."""

    def __init__(self, path, deadline, clock):
        self.sock = connect_unix(path, deadline, "QMP socket")
        self.clock = clock
        self.cond = threading.Condition()
        self.replies = {}
        self.events = []
        self.greeting = None
        self.closed = False
        self.next_id = 0
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        pending = b""
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self.cond:
                    self.closed = True
                    self.cond.notify_all()
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if not line.strip():
                    continue
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                with self.cond:
                    if "QMP" in msg:
                        self.greeting = (self.clock.now(), msg)
                    elif "event" in msg:
                        self.events.append((self.clock.now(), msg))
                    elif "id" in msg:
                        self.replies[msg["id"]] = msg
                    self.cond.notify_all()

    def _wait(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                value = predicate()
                if value is not None:
                    return value
                left = deadline - time.monotonic()
                if left <= 0 or self.closed:
                    raise DemoError(f"QMP: no {what} within {timeout:.0f} s" + (" (QEMU closed QMP)" if self.closed else ""))
                self.cond.wait(min(left, 0.5))

    def greeted(self, timeout):
        return self._wait(lambda: self.greeting, timeout, "greeting")

    def execute(self, command, arguments=None, timeout=5):
        with self.cond:
            self.next_id += 1
            cid = f"demo-{self.next_id}"
        msg = {"execute": command, "id": cid}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        reply = self._wait(lambda: self.replies.pop(cid, None), timeout, f"reply to {command}")
        if "error" in reply:
            raise DemoError(f"QMP {command}: {reply['error']}")
        return reply["return"]

    def wait_event(self, name, timeout):
        def find():
            for t, e in self.events:
                if e.get("event") == name:
                    return t, e
            return None
        return self._wait(find, timeout, f"{name} event")

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def connect_unix(path, deadline, what):
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > deadline:
                raise DemoError(f"cannot connect to the {what} at {path}")
            time.sleep(0.05)


def kvm_usable():
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
        return True
    except OSError:
        return False


def kvm_verdict_path():
    cache = os.environ.get("HVTRACE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "hvtrace")
    return os.path.join(cache, "kvm-broken")


def host_boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


def kvm_known_broken():
    """True when an earlier run in this host boot saw KVM fail to run a guest."""
    try:
        with open(kvm_verdict_path()) as f:
            return f.read().strip() == host_boot_id()
    except OSError:
        return False


def remember_kvm_broken():
    try:
        os.makedirs(os.path.dirname(kvm_verdict_path()), exist_ok=True)
        with open(kvm_verdict_path(), "w") as f:
            f.write(host_boot_id() + "\n")
    except OSError:
        pass


def describe_event(t, e, panic_time):
    ts = e.get("timestamp", {})
    qemu_time = ts.get("seconds", 0) + ts.get("microseconds", 0) / 1e6
    data = json.dumps(e.get("data", {}), separators=(",", ":"))
    rel = f", received {1000 * (t - panic_time):+.0f} ms after the crash command was typed"
    return f"QMP event {e['event']} {data} (QEMU timestamp {qemu_time:.6f}{rel})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--guest", choices=["6.12", "6.1"], default="6.12")
    ap.add_argument("--kernel-image", required=True)
    ap.add_argument("--initrd", required=True)
    ap.add_argument("--smp", type=int, default=2)
    ap.add_argument("--accel", choices=["auto", "kvm", "tcg"], default="auto",
                    help="auto: KVM when /dev/kvm opens and really runs the guest, else TCG")
    ap.add_argument("--boot-timeout", type=float, default=120)
    ap.add_argument("--keep", action="store_true", help="keep the run directory (console log, boot range copy)")
    args = ap.parse_args()

    clock = Clock()
    run_dir = tempfile.mkdtemp(prefix="hvtrace-crash-demo-")
    shm_path = None
    qemu = None
    serial = qmp = None

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    status = 1
    try:
        # Layout of the boot range (6.12 only). Node 1 starts right after node
        # 0 in guest-physical space while all RAM stays below the low-memory
        # limit, and must be larger than the range (by 48 MiB or more) or the
        # kernel gets no struct pages for it and refuses the boot instance.
        node0 = 1024 * MIB
        node1 = 64 * MIB
        trace_size = 16 * MIB
        trace_gpa = node0
        assert node1 >= trace_size + 48 * MIB
        assert node0 + node1 <= 2816 * MIB  # stays below QEMU pc's low-memory limit

        cmdline = "console=ttyS0"
        cmd = ["qemu-system-x86_64", "-machine", "pc", "-smp", str(args.smp),
               "-kernel", args.kernel_image, "-initrd", args.initrd,
               "-device", "pvpanic", "-action", "panic=pause",
               "-display", "none", "-nodefaults", "-no-user-config",
               "-serial", "chardev:ser0"]
        if args.guest == "6.12":
            shm_path = f"/dev/shm/hvtrace-crash-demo-{os.getpid()}"
            cmd += ["-m", f"{(node0 + node1) // MIB}M",
                    "-object", f"memory-backend-ram,id=m0,size={node0 // MIB}M",
                    "-object", f"memory-backend-file,id=m1,size={node1 // MIB}M,mem-path={shm_path},share=on",
                    "-numa", "node,nodeid=0,memdev=m0", "-numa", "node,nodeid=1,memdev=m1"]
            cmdline += (f" memmap={trace_size // MIB}M${trace_gpa:#x}"
                        f" trace_instance=boot_map@{trace_gpa:#x}:{trace_size // MIB}M,sched,irq")
        else:
            cmd += ["-m", "1024M"]
        cmd += ["-append", cmdline]

        def sockets(accel):
            return ["-chardev", f"socket,id=ser0,path={run_dir}/serial-{accel}.sock,server=on,wait=on",
                    "-qmp", f"unix:{run_dir}/qmp-{accel}.sock,server=on,wait=off"]

        if args.accel != "auto":
            accels = [args.accel]
        elif kvm_usable() and not kvm_known_broken():
            accels = ["kvm", "tcg"]
        else:
            accels = ["tcg"]
        for accel in accels:
            # One TCG thread: multi-threaded TCG breaks the guest kernel's live
            # text patching (an int3 oops in about one boot in 25).
            full = cmd + sockets(accel) + ["-accel", "kvm" if accel == "kvm" else "tcg,thread=single"]
            clock.say(f"starting QEMU ({accel}, {args.smp} vCPUs, {args.guest} guest)")
            print("    " + " ".join(f"'{c}'" if (" " in c or "$" in c) else c for c in full), flush=True)
            qemu_log = f"{run_dir}/qemu-{accel}.log"
            qemu = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=open(qemu_log, "wb"),
                                    stderr=subprocess.STDOUT, start_new_session=True)
            connect_deadline = time.monotonic() + 10
            serial = Serial(f"{run_dir}/serial-{accel}.sock", f"{run_dir}/console-{accel}.log", connect_deadline)
            qmp = Qmp(f"{run_dir}/qmp-{accel}.sock", connect_deadline, clock)
            t, greeting = qmp.greeted(10)
            v = greeting["QMP"]["version"]
            clock.say(f"QMP greeting (received at {t:.3f} s): QEMU {v['qemu']['major']}.{v['qemu']['minor']}."
                      f"{v['qemu']['micro']} ({v.get('package', '')}), capabilities {greeting['QMP']['capabilities']}")
            qmp.execute("qmp_capabilities")
            if accel != "kvm" or accel == accels[-1]:
                break
            # /dev/kvm can open and still not run a guest (nested KVM on some
            # clouds stops at the first instruction it cannot emulate, with
            # "KVM internal error" and a silent console). A working KVM guest
            # prints within a second; give it 15 s, then fall back to TCG.
            reason = "no console output in 15 s"
            kvm_deadline = time.monotonic() + 15
            while time.monotonic() < kvm_deadline:
                with open(qemu_log, "rb") as f:
                    if b"KVM internal error" in f.read():
                        reason = "KVM internal error"
                        break
                try:
                    serial.wait_for(re.compile(rb"\S"), 0.5, what="console output under KVM")
                    reason = None
                    break
                except DemoError:
                    pass
            if reason is None:
                break
            clock.say(f"KVM does not run this guest ({reason}); restarting under TCG "
                      f"(remembered until the host reboots: {kvm_verdict_path()})")
            remember_kvm_broken()
            qmp.close()
            serial.close()
            os.killpg(qemu.pid, signal.SIGKILL)
            qemu.wait()
            qemu = serial = qmp = None
            if shm_path and os.path.exists(shm_path):
                os.unlink(shm_path)

        m, _ = serial.wait_for(READY_RE, args.boot_timeout, what="ready line")
        clock.say(f"guest ready: HVTRACE-GUEST-READY {m.group(1).decode()}")

        marker = f"hvtrace-demo-{secrets.token_hex(4)}"
        instance = "/sys/kernel/tracing/instances/boot_map" if args.guest == "6.12" else "/sys/kernel/tracing"
        rc = serial.run(1, f"echo {marker} > {instance}/trace_marker")
        if rc != 0:
            raise DemoError(f"writing the marker failed with status {rc}; console tail:\n{serial.tail()}")
        clock.say(f"wrote marker '{marker}' to {instance}/trace_marker")
        seen = serial.run(2, f"grep -q {marker} {instance}/trace") == 0
        clock.say(f"the guest's own {instance}/trace shows the marker: {'yes' if seen else 'NO'}")

        panic_time = clock.now()
        clock.say("crashing the guest: echo c > /proc/sysrq-trigger")
        serial.send("echo c > /proc/sysrq-trigger\n")
        qmp.wait_event("GUEST_PANICKED", 60)
        qmp.wait_event("STOP", 10)
        time.sleep(0.2)  # anything else QEMU sends right after
        for t, e in qmp.events:
            print(f"[{t:7.3f} s] {describe_event(t, e, panic_time)}", flush=True)
        state = qmp.execute("query-status")
        clock.say(f"QMP query-status: {state['status']} (running={state['running']})")

        if shm_path:
            with open(shm_path, "rb") as f:
                data = f.read(trace_size)  # the range is at the start of node 1
            if args.keep:
                with open(f"{run_dir}/boot-range.bin", "wb") as f:
                    f.write(data)
            chunk = trace_size // args.smp
            for cpu in range(args.smp):
                magic, struct_size = struct.unpack_from("<Ii", data, cpu * chunk)
                ok = "ok" if magic == BOOT_MAP_MAGIC else "MISSING"
                print(f"    host file {shm_path} +{cpu * chunk:#09x}: CPU {cpu} ring_buffer_meta "
                      f"magic {magic:#010x} struct_size {struct_size} ({ok})")
            where = data.find(marker.encode())
            print(f"    marker '{marker}' in the host file: " + (f"yes, at offset {where:#x}" if where >= 0 else "no"))
            if where < 0 or any(struct.unpack_from("<I", data, c * chunk)[0] != BOOT_MAP_MAGIC for c in range(args.smp)):
                raise DemoError("the boot range in the host file is not what the guest kernel should have left")
        status = 0
    except DemoError as e:
        clock.say(f"FAILED: {e}")
    except KeyboardInterrupt as e:
        clock.say(f"interrupted ({e or '^C'})")
        status = 130
    finally:
        if qmp and qemu and qemu.poll() is None:
            try:
                qmp.execute("quit", timeout=3)
            except (DemoError, OSError):
                pass
        if qemu:
            try:
                qemu.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(qemu.pid, signal.SIGKILL)
                qemu.wait()
            clock.say(f"QEMU stopped (exit status {qemu.returncode})")
        for c in (serial, qmp):
            if c:
                c.close()
        if shm_path and os.path.exists(shm_path):
            os.unlink(shm_path)
        if args.keep:
            print(f"    kept {run_dir} (console-*.log, qemu-*.log" + (", boot-range.bin)" if shm_path else ")"))
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
