#!/usr/bin/env python3
"""Runs the shared test vectors (p4/vectors/*.json) against the P4 program on
BMv2 simple_switch: the same frames, expected frames and counters that
userspace/xina/tests/p4_vectors.rs runs on the XDP dataplane.

Needs root, p4c-bm2-ss, simple_switch and simple_switch_CLI (neither is in a
package registry; see p4/README.md), and the xina command (for the control-plane
entries and the frames: `xina p4 vectors`). Tools are found on PATH or through
the environment: P4C_BM2_SS, SIMPLE_SWITCH, SIMPLE_SWITCH_CLI, XINA.

For each vector a fresh switch runs in its own network namespace
(xina-p4-<pid>-<n>, removed afterwards whatever happens), with one veth pair per
switch port (port i <-> veth "sw<i>" / test end "h<i>") and one for CPU_PORT
(64, where frames that are not xina go: the host's stack). The control-plane
commands of `xina p4 emit` are loaded, then each step's frame is sent on the
ingress port's test end; the frames that come out of every test end within a
short wait must be exactly the expected ones, and the switch-wide counters
(ingress + egress instances) must have changed by exactly the expected amounts.

Exit status: 0 all vectors passed, 1 a vector failed, 2 a tool is missing (the
message names it; nothing was run).
"""

import argparse
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
THRIFT_PORT = 9090
WAIT_S = 0.4


def tool(env, name):
    path = os.environ.get(env) or shutil.which(name)
    if not path or not os.access(path, os.X_OK):
        return None
    return path


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def cli(cli_path, commands):
    """Feeds commands to simple_switch_CLI; returns its output."""
    p = subprocess.run([cli_path, "--thrift-port", str(THRIFT_PORT)], input=commands,
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"simple_switch_CLI failed: {p.stderr.strip()}")
    return p.stdout


def read_counters(cli_path, arrays, names):
    lines = "".join(f"counter_read {a} {i}\n" for a in arrays for i in range(len(names)))
    out = cli(cli_path, lines)
    # "XinaIngress.counters.switch_counters[3]= (74 bytes, 1 packets)"
    values = [int(m.group(1)) for m in re.finditer(r"\]=\s*\(\d+ bytes, (\d+) packets\)", out)]
    if len(values) != len(arrays) * len(names):
        raise RuntimeError(f"counter_read gave {len(values)} values:\n{out}")
    n = len(names)
    return {name: sum(values[a * n + i] for a in range(len(arrays))) for i, name in enumerate(names)}


def open_socket(ifname):
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((ifname, 0))
    s.setblocking(False)
    return s


def drain(socks, wait):
    """Frames received (not sent) on each socket within `wait` seconds."""
    got = []
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return got
        ready, _, _ = select.select(list(socks), [], [], left)
        for s in ready:
            while True:
                try:
                    data, addr = s.recvfrom(65535)
                except BlockingIOError:
                    break
                if addr[2] != PACKET_OUTGOING:
                    got.append((socks[s], data.hex()))


def run_vector(v, tools, json_path, ns):
    """Inside network namespace `ns`: one switch, the vector's steps."""
    ports = [p["port"] for p in v["ports"]] + [v["cpu_port"]]
    run(["ip", "link", "set", "lo", "up"])  # the CLI reaches the switch's Thrift server
    for p in ports:
        run(["ip", "link", "add", f"sw{p}", "type", "veth", "peer", "name", f"h{p}"])
        for dev in (f"sw{p}", f"h{p}"):
            run(["sysctl", "-qw", f"net.ipv6.conf.{dev}.disable_ipv6=1"])
            run(["ip", "link", "set", dev, "up", "mtu", "9000"])
    log = tempfile.NamedTemporaryFile(prefix="simple_switch-", suffix=".log", delete=False)
    args = [tools["simple_switch"], "--thrift-port", str(THRIFT_PORT), "--device-id", "0"]
    for p in ports:
        args += ["-i", f"{p}@sw{p}"]
    switch = subprocess.Popen(args + [json_path], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):
            try:
                cli(tools["simple_switch_CLI"], "show_ports\n")
                break
            except (RuntimeError, subprocess.TimeoutExpired):
                time.sleep(0.2)
        else:
            raise RuntimeError("simple_switch did not answer its CLI")
        out = cli(tools["simple_switch_CLI"], v["commands"])
        errors = [l for l in out.splitlines() if "Error" in l or "Invalid" in l]
        if errors:
            raise RuntimeError("loading the entries: " + "; ".join(errors[:5]))
        socks = {open_socket(f"h{p}"): p for p in ports}
        by_port = {p: s for s, p in socks.items()}
        drain(socks, 0.2)
        failures = []
        before = read_counters(tools["simple_switch_CLI"], v["counter_arrays"], v["counter_names"])
        for i, step in enumerate(v["steps"]):
            by_port[step["in_port"]].send(bytes.fromhex(step["frame"]))
            got = sorted(drain(socks, WAIT_S))
            want = sorted((o["port"], o["frame"]) for o in step["outputs"])
            after = read_counters(tools["simple_switch_CLI"], v["counter_arrays"], v["counter_names"])
            delta = {k: after[k] - before[k] for k in after}
            before = after
            at = f"{v['name']} step {i} ({step['about']})"
            if got != want:
                failures.append(f"{at}: frames out differ\n  got:  {got}\n  want: {want}")
            bad = {k: (delta[k], step["counters"][k]) for k in delta if delta[k] != step["counters"][k]}
            if bad:
                failures.append(f"{at}: counters (got, want): {bad}")
        for s in socks:
            s.close()
        return failures
    finally:
        switch.terminate()
        try:
            switch.wait(timeout=10)
        except subprocess.TimeoutExpired:
            switch.kill()
            switch.wait()
        log.close()
        os.unlink(log.name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vectors", default=os.path.join(HERE, "vectors"))
    ap.add_argument("--inside", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.inside:
        # Re-executed inside the vector's network namespace.
        job = json.load(open(a.inside))
        failures = run_vector(job["vector"], job["tools"], job["json"], job["ns"])
        json.dump(failures, open(a.inside + ".out", "w"))
        return 0

    tools = {
        "p4c-bm2-ss": tool("P4C_BM2_SS", "p4c-bm2-ss"),
        "simple_switch": tool("SIMPLE_SWITCH", "simple_switch"),
        "simple_switch_CLI": tool("SIMPLE_SWITCH_CLI", "simple_switch_CLI"),
        "xina": tool("XINA", "xina"),
    }
    missing = [k for k, v in tools.items() if v is None]
    if missing:
        print("run_vectors.py: not run: missing " + ", ".join(missing)
              + ". p4c (p4c-bm2-ss) and BMv2 (simple_switch, simple_switch_CLI) are in no"
              " package registry: build them from source (p4/README.md) and put them on PATH or"
              " name them with P4C_BM2_SS / SIMPLE_SWITCH / SIMPLE_SWITCH_CLI; xina comes from"
              " `cargo build -p xina` (XINA=target/debug/xina).", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("run_vectors.py: needs root (network namespaces, veths)", file=sys.stderr)
        return 2

    work = tempfile.mkdtemp(prefix="xina-p4-")
    try:
        json_path = os.path.join(work, "xina.json")
        run([tools["p4c-bm2-ss"], "--std", "p4-16", "-o", json_path, os.path.join(HERE, "xina.p4")])
        expanded = subprocess.run([tools["xina"], "p4", "vectors", "--dir", a.vectors],
                                  check=True, capture_output=True, text=True).stdout
        vectors = json.loads(expanded)["vectors"]
        failures, ran, steps = [], 0, 0
        for n, v in enumerate(vectors):
            only = v.get("only")
            if only and only["backend"] != "p4":
                print(f"skip {v['name']}: {only['backend']} only: {only['why']}")
                continue
            ns = f"xina-p4-{os.getpid()}-{n}"
            job_path = os.path.join(work, f"{v['name']}.job.json")
            json.dump({"vector": v, "tools": tools, "json": json_path, "ns": ns}, open(job_path, "w"))
            run(["ip", "netns", "add", ns])
            try:
                run(["ip", "netns", "exec", ns, sys.executable, os.path.abspath(__file__),
                     "--inside", job_path])
                got = json.load(open(job_path + ".out"))
            finally:
                subprocess.run(["ip", "netns", "del", ns])
            ran += 1
            steps += len(v["steps"])
            print(f"{'FAIL' if got else 'ok  '} {v['name']}: {len(v['steps'])} steps")
            failures += got
        for f in failures:
            print(f)
        print(f"{ran - len({f.split(' step ')[0] for f in failures})} passed, "
              f"{len({f.split(' step ')[0] for f in failures})} failed ({steps} steps)")
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
