#!/usr/bin/env bash
# The kernel matrix: runs the same checks of already built binaries on
# several kernels, because a verifier verdict belongs to the kernel, not
# to the program alone (an object can load on one kernel and be refused on
# the next; see the kernel matrix notes). The kernels are Debian 12's 6.1
# LTS (what Debian 12 servers run), Debian 12's 6.12 LTS, and the kernel
# this machine runs; the first two boot under qemu through virtme-ng (vng),
# which shares this machine's root file system read-only with the guest, so
# the host's binaries run there unchanged. Emulated (TCG, no KVM: a nested
# KVM guest hangs on these hosts), a boot takes about half a minute.
#
#   testbed/scripts/kernels.sh [--kernels 6.1,6.12,running] [--bin-dir DIR]
#                              [--timeout SECS]
#
# --kernels   comma-separated: `6.1` (the newest linux-image-6.1.0-*-amd64
#             package apt knows), `6.12` (the newest linux-image-6.12.*
#             -amd64 one), `running` (this machine's kernel, no VM), or the
#             release of any kernel with a /boot/vmlinuz-RELEASE. Default:
#             all three, in that order.
# --bin-dir   where `xina` and `xina-testbed` are (default: target/debug of
#             the repository; a relative path is taken from the directory
#             the script is started in). Nothing is built here.
# --timeout   seconds one kernel may take, boot included (default 900); a
#             kernel over it counts as failed and the next one runs.
#
# Needs root. Installs what the VMs need when it is missing (qemu, a static
# busybox for vng's initramfs, the kernel images, virtme-ng with pip) and
# says so on stderr. The guests' output is streamed with the kernel release
# in front of each line; at the end one line per kernel says PASS or FAIL
# and how long it took; the exit status is nonzero when any kernel failed.
set -euo pipefail

say() { printf 'xina-kernels: %s\n' "$*" >&2; }
die() {
    say "$*"
    exit 1
}

# The checks each kernel runs, in order, given the directory of the
# binaries. Every check runs even when an earlier one failed (a load
# refused by one verifier says little about the other paths).
checks() {
    local bin=$1 tmp
    tmp=$(mktemp -d)
    # Loads the whole dataplane and prints each program's verified
    # instructions; fails when any is over a quarter of the budget.
    check switch-check "$bin/xina" switch check
    # The narrow path.
    check demo "$bin/xina-testbed" demo --workers 2 --elements 100000
    # The narrow and the wide path.
    check allreduce "$bin/xina-testbed" bench allreduce --workers 2 --sizes 1MiB \
        --frame 1500,65000 --reps 1 --impls xina --json "$tmp/allreduce.json"
    # Multicast.
    check bcast "$bin/xina-testbed" bench bcast --ranks 2 --sizes 1MiB --reps 1 \
        --impls xina --json "$tmp/bcast.json"
    # A pinned switch brought up and down: its fan-out attachment (a TCX
    # link, or a clsact filter before 6.6) must come and go with it.
    check pinned pinned_up_down "$bin/xina" "$tmp"
    rm -rf "$tmp"
}

# `xina switch up`, `status` and `down` of a pinned one-port switch in a
# namespace of its own; fails if the fan-out program is not attached to
# the port while the switch is up, or still attached after `down`.
pinned_up_down() {
    local xina=$1 dir=$2 ns rc=0 link= pin
    ns=xk$$r$RANDOM
    ip netns add "$ns"
    ip -n "$ns" link add xkp0 type veth peer name xkp1
    ip -n "$ns" link set xkp0 up
    ip -n "$ns" link set xkp1 up
    printf '[switch]\nports = ["xkp0"]\n' >"$dir/pinned.toml"
    # The port's clsact filters running the fan-out program (before 6.6).
    filters() { ip netns exec "$ns" bpftool net show dev xkp0 | grep -c xina_fanout || true; }
    # Whether kernel link `$1` (a TCX link, 6.6 on) exists and runs the
    # fan-out program. bpftool 7.1 shows a TCX link without its device, so
    # the link is found through the switch's pin.
    tcx_link() {
        local prog
        prog=$(bpftool link show id "$1" 2>/dev/null | awk 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "prog") print $(i + 1) }')
        [ -n "$prog" ] || return 1
        # Not `| grep -q`: under pipefail, bpftool killed by SIGPIPE once
        # grep has its match would make the pipeline fail.
        [[ $(bpftool prog show id "$prog") == *" name xina_fanout "* ]]
    }
    if ! "$xina" -n "$ns" --switch "$ns" switch up -c "$dir/pinned.toml" ||
        ! "$xina" -n "$ns" --switch "$ns" switch status; then
        rc=1
    else
        pin=$(find "/sys/fs/bpf/xina/$ns/links" -name 'xkp0:*:tc' 2>/dev/null | head -n 1)
        if [ -n "$pin" ]; then
            link=$(bpftool link show pinned "$pin" | awk -F: 'NR == 1 { print $1 }')
        fi
        if [ "$(filters)" = 0 ] && ! { [ -n "$link" ] && tcx_link "$link"; }; then
            echo "the fan-out program is not attached to the port of a switch that is up"
            rc=1
        fi
    fi
    "$xina" -n "$ns" --switch "$ns" switch down || rc=1
    # A detached link goes away after an RCU grace period.
    local gone=false
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        if [ "$(filters)" = 0 ] && ! { [ -n "$link" ] && tcx_link "$link"; }; then
            gone=true
            break
        fi
        sleep 0.3
    done
    if ! $gone; then
        echo "the fan-out program is still attached after switch down"
        rc=1
    fi
    ip netns del "$ns"
    return "$rc"
}

# Inside a guest (or on the running kernel): `check NAME COMMAND...` runs
# one check and records it in `failed`.
failed=()
check() {
    local name=$1 start rc
    shift
    echo "== $name: $*"
    start=$SECONDS
    set +e
    "$@"
    rc=$?
    set -e
    if [ "$rc" = 0 ]; then
        echo "-- $name: PASS ($((SECONDS - start)) s)"
    else
        echo "-- $name: FAIL (exit $rc, $((SECONDS - start)) s)"
        failed+=("$name")
    fi
}

# The last line the checks print; the host reads the verdict from it.
RESULT_TAG=XINA-KERNELS-RESULT

kernels=6.1,6.12,running
bin_dir=
timeout_s=900
inside=false
while [ $# -gt 0 ]; do
    case $1 in
    --kernels) kernels=${2:?--kernels needs a list}; shift 2 ;;
    --kernels=*) kernels=${1#*=}; shift ;;
    --bin-dir) bin_dir=${2:?--bin-dir needs a directory}; shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --timeout) timeout_s=${2:?--timeout needs seconds}; shift 2 ;;
    --timeout=*) timeout_s=${1#*=}; shift ;;
    # Hidden: what runs inside each guest (and on the running kernel).
    --inside) inside=true; shift ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
        exit 0
        ;;
    *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ $timeout_s =~ ^[1-9][0-9]*$ ]] || die "--timeout: not a number of seconds: $timeout_s"

if [ "$(id -u)" != 0 ]; then
    die "run as root: loading XDP programs, building network namespaces and installing packages need it"
fi

# A relative --bin-dir is taken from where the script was started.
if [ -n "$bin_dir" ] && [[ $bin_dir != /* ]]; then
    bin_dir=$PWD/$bin_dir
fi
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
cd "$(dirname "$0")/../.."
repo=$PWD
bin_dir=${bin_dir:-$repo/target/debug}

if $inside; then
    echo "xina-kernels: on Linux $(uname -r), $(nproc) CPUs, binaries from $bin_dir"
    # xina mounts bpffs itself when nothing is there, but a guest starts
    # without one and mounting it here keeps every check on equal terms.
    mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
    since=$(mktemp)
    checks "$bin_dir"
    # A refused program leaves the verifier's log in $TMPDIR, which in a
    # guest vanishes with it: show the end of each new one (the verdict
    # and the path that led to it).
    while IFS= read -r -d '' f; do
        echo "== the last 25 lines of $f:"
        tail -n 25 "$f"
    done < <(find "${TMPDIR:-/tmp}" -maxdepth 1 -name 'xina-verifier-*.log' -size +0 -newer "$since" -print0)
    rm -f "$since"
    echo "$RESULT_TAG: ${failed[*]:-none}"
    [ ${#failed[@]} = 0 ]
    exit
fi

for b in xina xina-testbed; do
    [ -x "$bin_dir/$b" ] || die "no executable $bin_dir/$b (build it first, or pass --bin-dir)"
done
bin_dir=$(cd "$bin_dir" && pwd)

# --- What the VMs need -----------------------------------------------------

apt_updated=false
apt_update() {
    if ! $apt_updated; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=true
    fi
}

installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# The newest kernel image of a series that apt knows of (empty if none).
# Debian 12 carries both series (6.12 from bookworm-security, no backports
# needed); the ABI numbers in the names move with its updates.
newest_image() {
    local re
    case $1 in
    6.1) re='^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$' ;;
    6.12) re='^linux-image-6\.12\.[0-9]+\+[a-z0-9.~]+-amd64-unsigned$' ;;
    *) return 1 ;;
    esac
    { apt-cache search --names-only '^linux-image-6\.' 2>/dev/null || true; } |
        awk '{ print $1 }' | { grep -E "$re" || true; } | sort -V | tail -n 1
}

# Resolves every entry of --kernels to a label and a release (the file
# /boot/vmlinuz-RELEASE; empty for the running kernel) in `labels` and
# `releases`, installing what is missing.
labels=()
releases=()
IFS=, read -r -a wanted <<<"$kernels"
[ ${#wanted[@]} -gt 0 ] || die "--kernels: empty list"

series=()
for k in "${wanted[@]}"; do
    case $k in
    6.1 | 6.12) series+=("$k") ;;
    running) ;;
    *) [ -e "/boot/vmlinuz-$k" ] ||
        die "--kernels: unknown kernel '$k' (6.1, 6.12, running, or a release with /boot/vmlinuz-RELEASE)" ;;
    esac
done

declare -A image=()
resolve_images() {
    local s
    for s in "${series[@]}"; do
        image[$s]=$(newest_image "$s")
    done
}
need_vm=false
for k in "${wanted[@]}"; do [ "$k" = running ] || need_vm=true; done

if $need_vm; then
    resolve_images
    missing=()
    command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
    # vng builds its initramfs around a static busybox.
    installed busybox-static || missing+=(busybox-static)
    stale=false
    for s in "${series[@]}"; do
        if [ -z "${image[$s]}" ] || ! installed "${image[$s]}"; then stale=true; fi
    done
    if [ ${#missing[@]} -gt 0 ] || $stale; then
        # Installing anyway: resolve against fresh lists.
        apt_update
        resolve_images
        for s in "${series[@]}"; do
            [ -n "${image[$s]}" ] || die "no linux-image-$s.*-amd64-unsigned package known to apt (needs Debian 12 bookworm with bookworm-security in the apt sources)"
            installed "${image[$s]}" || missing+=("${image[$s]}")
        done
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing Debian packages: ${missing[*]} (a kernel image builds its initrd: about a minute each)"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    if ! command -v vng >/dev/null; then
        say "installing virtme-ng with pip (provides vng)"
        if ! python3 -m pip install -q virtme-ng; then
            # Debian's own python3 refuses system-wide installs (PEP 668).
            say "pip refused; retrying with --break-system-packages"
            python3 -m pip install -q --break-system-packages virtme-ng
        fi
        hash -r
        command -v vng >/dev/null || die "virtme-ng installed but vng is not on PATH ($PATH)"
    fi
fi

for k in "${wanted[@]}"; do
    case $k in
    running) labels+=(running); releases+=("") ;;
    6.1 | 6.12)
        rel=${image[$k]#linux-image-}
        rel=${rel%-unsigned}
        [ -e "/boot/vmlinuz-$rel" ] || die "${image[$k]} is installed but /boot/vmlinuz-$rel is missing"
        labels+=("$k"); releases+=("$rel")
        ;;
    *) labels+=("$k"); releases+=("$k") ;;
    esac
done

# --- The matrix ---------------------------------------------------------------

log=$(mktemp)
trap 'rm -f "$log"' EXIT

# What to run inside: this script again, with the binaries' absolute path.
# A guest gets none of this environment, so pass on the logging knobs.
inner=$(printf '%q ' bash "$self" --inside --bin-dir "$bin_dir")
for v in RUST_LOG RUST_BACKTRACE; do
    if [ -n "${!v:-}" ]; then inner="$v=$(printf '%q' "${!v}") $inner"; fi
done

summary=()
any_failed=false
for i in "${!labels[@]}"; do
    label=${labels[$i]}
    rel=${releases[$i]}
    if [ -z "$rel" ]; then
        shown="$(uname -r) (running)"
        cmd=(bash "$self" --inside --bin-dir "$bin_dir")
    else
        shown=$rel
        cmd=(vng -r "/boot/vmlinuz-$rel" --memory 4G --cpus 2 --disable-kvm -- "$inner")
    fi
    echo "=== $shown: $([ -z "$rel" ] && echo directly || echo "booting under qemu (TCG)")"
    start=$SECONDS
    # stdin from /dev/null: vng would otherwise read this script's stdin.
    # Output through a pipe: qemu writes its console to a file opened
    # anew (clobbering what surrounds it when stdout is a plain file).
    set +e
    timeout -k 30 "$timeout_s" "${cmd[@]}" </dev/null 2>&1 |
        sed -u -e 's/\r$//' -e "s/^/[$label] /" | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    secs=$((SECONDS - start))
    result=$(sed -n "s/.*$RESULT_TAG: //p" "$log" | tail -n 1)
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        verdict="FAIL  ${secs} s  timed out after ${timeout_s} s"
    elif [ "$rc" = 0 ] && [ "$result" = none ]; then
        verdict="PASS  ${secs} s"
    elif [ -n "$result" ] && [ "$result" != none ]; then
        verdict="FAIL  ${secs} s  failed: $result"
    else
        verdict="FAIL  ${secs} s  exit $rc before any result (did the kernel boot?)"
    fi
    [[ $verdict == PASS* ]] || any_failed=true
    line=$(printf '%-32s %s' "$shown" "$verdict")
    echo "=== $line"
    summary+=("$line")
done

echo
echo "kernel matrix:"
printf '  %s\n' "${summary[@]}"
! $any_failed
