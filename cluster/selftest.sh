#!/usr/bin/env bash
# The whole cluster journey on this one machine, as a new user would walk it:
#
#   make cluster-selftest        # or: sudo cluster/selftest.sh   (Linux, root, ~5-10 minutes)
#
# 1. a throwaway SSH node on 127.0.0.1: a new OS user, a generated ed25519 key, its own sshd
#    bound to 127.0.0.1 on a free port (openssh-server and rsync are installed with apt-get if
#    missing, without starting the system's ssh service);
# 2. a copy of ray_cluster.yaml filled by its CHANGE: values only (head_ip 127.0.0.1, no
#    workers, the user and key, a unique cluster name, free ports);
# 3. `ray up` (copies the code, builds the node's venv, fetches Fashion-MNIST, starts the head)
#    and a check that every socket the node's processes listen on is on loopback;
# 4. `ray dashboard` (the SSH tunnel; on 127.0.0.1:8265 when that port is free, so
#    cluster/submit.sh runs with its default address);
# 5. run A: `cluster/submit.sh run ...` without output_dir: it must print an absolute run
#    directory under the node's $FL_LIGHTNING_RUNS;
# 6. run B, the same run: stopped with the job API after its first round checkpoint, then
#    `cluster/submit.sh resume <the path it printed>`;
# 7. `cluster/fetch_runs.sh` brings the runs home (into a scratch folder, not this repo's
#    runs/), `fl-lightning compare` compares them, and B (killed + resumed) must equal A round
#    for round;
# 8. `ray down`; the runs must still be on the node.
#
# Everything it starts is stopped by PID (the dashboard tunnel, ssh control masters that use its
# key, sshd and the processes below it, anything left running as the throwaway user), the user
# and its home are removed, and so are its temporary folders, by a trap on any exit. It exits
# non-zero with one line at the first failure; the step logs are then kept in
# /tmp/fl_selftest_logs.*. Nothing is kept after a success.
#
# Ray stays on loopback (as fl_lightning/runtime/local_ray.py keeps it): the node user's shell exports
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, RAY_USAGE_STATS_ENABLED=0, RAY_USAGE_STATS_REPORT_URL=
# http://127.0.0.1:9/, RAY_AUTH_MODE=disabled and its own RAY_TMPDIR/TMPDIR before `ray up`
# starts anything (HOME holds the ray_bootstrap_config.yaml that `ray up` uploads); the ray CLI
# here gets the same variables, a scratch HOME, RAY_TMPDIR and TMPDIR.
#
# Differences from a real node, all from running on one machine: sshd listens on a free port
# rather than 22, so `ssh` is reached through a wrapper that adds `-o Port=<port>` (PATH,
# this script only); the node installs Python packages with this machine's pip configuration
# (copied to the user); the kill in step 6 watches the checkpoint file on the node's disk.
#
# Variables: FL_SELFTEST_VENV (the venv with the ray CLI, default <repo>/.venv),
# FL_SELFTEST_ROUNDS (rounds per run, default 4), FL_SELFTEST_KEEP_LOGS=1 (keep the logs
# after a success too).
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FL_SELFTEST_VENV:-$REPO/.venv}"
PY="$VENV/bin/python"
RAYCLI="$VENV/bin/ray"
ROUNDS="${FL_SELFTEST_ROUNDS:-4}"
EXPERIMENT=selftest
RUN_ARGS=(method=fedavg data=fmnist fl.num_clients=4 "fl.rounds=$ROUNDS" data.train_subset=2000
          data.test_subset=1000 seed=0 "experiment=$EXPERIMENT")
T0=$SECONDS
STEP="start"

say() { printf '[%4ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { FAILED="$*"; exit 1; }  # the EXIT trap prints the one line and cleans up

# --- state for the cleanup ---------------------------------------------------------------------
WORK="" NODE_USER="" NODE_UID="" NODE_HOME="" SSHD_PID="" DASH_PID="" CLUSTER_YAML=""
CLUSTER_NAME="" RAY_IS_UP=0 MADE_RUN_SSHD=0 MADE_POLICY=0 FAILED="" LOGS_KEPT=""
PRE_SSH_DIRS=""

pids_of_uid() {  # every process running as uid $1
  local d
  for d in /proc/[0-9]*; do
    [[ "$(stat -c %u "$d" 2>/dev/null)" == "$1" ]] && echo "${d#/proc/}"
  done
}

pids_with_arg() {  # processes whose command line contains $1 (our unique $WORK path)
  local d
  for d in /proc/[0-9]*; do
    [[ "${d#/proc/}" == "$$" || "${d#/proc/}" == "$BASHPID" || "${d#/proc/}" == "$SSHD_PID" ]] && continue
    tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -qF -- "$1" && echo "${d#/proc/}"
  done
}

descendants() {  # pids below $1
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}

stop_pids() {  # SIGTERM, wait up to $1 s, SIGKILL the rest; only the PIDs given
  local wait_s="$1"; shift
  [[ $# -gt 0 ]] || return 0
  kill -TERM "$@" 2>/dev/null
  local i
  for ((i = 0; i < wait_s * 5; i++)); do
    local alive=0 p
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && return 0
    sleep 0.2
  done
  kill -KILL "$@" 2>/dev/null
  return 0
}

cleanup() {
  local rc=$? msg leftovers=()
  trap - EXIT INT TERM
  set +e
  if [[ -n "$FAILED" ]]; then
    rc=1
  elif [[ $rc -ne 0 ]]; then
    FAILED="$STEP: interrupted or unexpected exit $rc"
  fi
  # 1. the dashboard tunnel (its own process group: the ray CLI and its ssh)
  if [[ -n "$DASH_PID" ]]; then
    kill -TERM -- "-$DASH_PID" 2>/dev/null; sleep 1; kill -KILL -- "-$DASH_PID" 2>/dev/null
  fi
  # 2. the cluster
  if [[ $RAY_IS_UP == 1 && -n "$CLUSTER_YAML" ]]; then
    (cd "$REPO" && timeout 300 "$RAYCLI" down -y "$CLUSTER_YAML") >>"$WORK/logs/ray_down_cleanup.log" 2>&1
  fi
  # 3. anything still running as the throwaway user (only ours: we created the user)
  if [[ -n "$NODE_UID" ]]; then
    # shellcheck disable=SC2046
    stop_pids 10 $(pids_of_uid "$NODE_UID")
  fi
  # 4. ssh clients that use our key or files (ControlMaster processes outlive their ssh call);
  #    not sshd, whose session processes are collected below it next
  if [[ -n "$WORK" ]]; then
    # shellcheck disable=SC2046
    stop_pids 5 $(pids_with_arg "$WORK/")
  fi
  # 5. our sshd and its session processes
  if [[ -n "$SSHD_PID" ]]; then
    local below
    below="$(descendants "$SSHD_PID")"
    # shellcheck disable=SC2086
    stop_pids 5 $below "$SSHD_PID"
  fi
  # 6. the user and its home (venv, data, runs, W&B files)
  if [[ -n "$NODE_USER" ]] && id "$NODE_USER" >/dev/null 2>&1; then
    userdel -r "$NODE_USER" >/dev/null 2>&1 || userdel -f -r "$NODE_USER" >/dev/null 2>&1
  fi
  # 7. Ray's ssh control folder for this cluster (/tmp/ray_ssh_<user hash>/<cluster hash>)
  if [[ -n "$CLUSTER_NAME" ]]; then
    local ctl
    ctl="$("$PY" -I -c 'import getpass, hashlib, sys
u = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
c = hashlib.sha256(sys.argv[1].encode()).hexdigest()[:10]
print(f"/tmp/ray_ssh_{u}/{c}")' "$CLUSTER_NAME" 2>/dev/null)"
    if [[ -n "$ctl" ]]; then
      rm -rf "$ctl"
      [[ " $PRE_SSH_DIRS " == *" $(dirname "$ctl") "* ]] || rmdir "$(dirname "$ctl")" 2>/dev/null
    fi
  fi
  [[ $MADE_RUN_SSHD == 1 ]] && rmdir /run/sshd 2>/dev/null
  [[ $MADE_POLICY == 1 ]] && rm -f /usr/sbin/policy-rc.d
  # 8. our scratch folder; the logs survive a failure
  if [[ -n "$WORK" && -d "$WORK" ]]; then
    if [[ -n "$FAILED" || "${FL_SELFTEST_KEEP_LOGS:-0}" == 1 ]]; then
      LOGS_KEPT="$(mktemp -d /tmp/fl_selftest_logs.XXXXXX)"
      cp -a "$WORK/logs/." "$LOGS_KEPT/" 2>/dev/null
    fi
    rm -rf "$WORK"
  fi
  # 9. nothing of ours may be left
  if [[ -n "$NODE_UID" && -n "$(pids_of_uid "$NODE_UID")" ]]; then leftovers+=("processes of uid $NODE_UID"); fi
  if [[ -n "$WORK" && -n "$(pids_with_arg "$WORK/")" ]]; then leftovers+=("processes using $WORK"); fi
  if [[ -n "$SSHD_PID" ]] && kill -0 "$SSHD_PID" 2>/dev/null; then leftovers+=("sshd $SSHD_PID"); fi
  if [[ -n "$NODE_USER" ]] && id "$NODE_USER" >/dev/null 2>&1; then leftovers+=("user $NODE_USER"); fi
  if [[ -n "$NODE_HOME" && -e "$NODE_HOME" ]]; then leftovers+=("$NODE_HOME"); fi
  if [[ -n "$WORK" && -e "$WORK" ]]; then leftovers+=("$WORK"); fi
  if [[ ${#leftovers[@]} -gt 0 ]]; then
    msg="left behind: ${leftovers[*]}"
    [[ -z "$FAILED" ]] && FAILED="cleanup: $msg"
    rc=1
  fi
  if [[ -n "$FAILED" ]]; then
    echo "cluster-selftest: FAILED at $FAILED${LOGS_KEPT:+ (logs: $LOGS_KEPT)}" >&2
  else
    say "cleanup: tunnel, cluster, sshd, user $NODE_USER and $WORK gone; nothing of ours running"
    [[ -n "$LOGS_KEPT" ]] && say "logs kept in $LOGS_KEPT"
    say "cluster-selftest: OK"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'FAILED="$STEP: interrupted"; exit 130' INT TERM

# --- 0. what is needed ------------------------------------------------------------------------
STEP="preflight"
[[ "$(uname -s)" == Linux ]] || fail "preflight: Linux only"
[[ "$(id -u)" == 0 ]] || fail "preflight: needs root (it creates a user and runs sshd): sudo $0"
[[ -x "$RAYCLI" && -x "$PY" ]] || fail "preflight: no ray CLI in $VENV (run \`make venv\` or set FL_SELFTEST_VENV)"
RAY_VERSION="$("$RAYCLI" --version 2>/dev/null | awk '{print $NF}')"

STEP="packages"
need=()
[[ -x /usr/sbin/sshd ]] || need+=(openssh-server)
command -v rsync >/dev/null || need+=(rsync)
command -v ssh-keygen >/dev/null || need+=(openssh-client)
if [[ ${#need[@]} -gt 0 ]]; then
  say "installing ${need[*]} (apt-get; the system's ssh service is not started)"
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then  # Debian's switch that keeps services from starting
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && MADE_POLICY=1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${need[@]}" >/tmp/fl_selftest_apt.log 2>&1 ||
    { apt-get update -q >>/tmp/fl_selftest_apt.log 2>&1 &&
      apt-get install -y -q --no-install-recommends "${need[@]}" >>/tmp/fl_selftest_apt.log 2>&1; } ||
    fail "packages: apt-get install ${need[*]} failed (see /tmp/fl_selftest_apt.log)"
  rm -f /tmp/fl_selftest_apt.log
  [[ $MADE_POLICY == 1 ]] && rm -f /usr/sbin/policy-rc.d && MADE_POLICY=0
fi
SSH_VERSION="$(ssh -V 2>&1 | awk '{print $1}' | tr -d ,)"
say "machine: $(. /etc/os-release && echo "$PRETTY_NAME"), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), Ray $RAY_VERSION, $SSH_VERSION, $(rsync --version | head -n 1 | awk '{print $1, $3}')"

# --- 1. the throwaway node ---------------------------------------------------------------------
STEP="node"
TAG="$(head -c 3 /dev/urandom | od -An -tx1 | tr -d ' \n')"
PRE_SSH_DIRS="$(ls -d /tmp/ray_ssh_* 2>/dev/null | tr '\n' ' ')"
WORK="$(mktemp -d /tmp/flst.XXXXXX)"  # short: Ray's unix sockets live below the node's RAY_TMPDIR
chmod 755 "$WORK"
mkdir -p "$WORK"/{logs,ssh,bin,home,l,t,local}
ROOT_HOME="$(getent passwd "$(id -un)" | cut -d: -f6)"
NODE_USER="flst$TAG"
useradd --create-home --shell /bin/bash --comment "fl_lightning cluster selftest" "$NODE_USER" ||
  { NODE_USER=""; fail "node: useradd failed"; }
NODE_UID="$(id -u "$NODE_USER")"
NODE_HOME="$(getent passwd "$NODE_USER" | cut -d: -f6)"
usermod -p '*' "$NODE_USER"  # no password, but not locked: key login works with UsePAM no
ssh-keygen -q -t ed25519 -N '' -C "fl-selftest-$TAG" -f "$WORK/ssh/id_ed25519" || fail "node: ssh-keygen failed"
ssh-keygen -q -t ed25519 -N '' -f "$WORK/ssh/host_ed25519" || fail "node: ssh-keygen (host key) failed"
install -d -m 700 -o "$NODE_USER" -g "$NODE_USER" "$NODE_HOME/.ssh"
install -m 600 -o "$NODE_USER" -g "$NODE_USER" "$WORK/ssh/id_ed25519.pub" "$NODE_HOME/.ssh/authorized_keys"
install -d -m 700 -o "$NODE_USER" -g "$NODE_USER" "$WORK/n" "$WORK/nt"

# The node user's shell: Ray on loopback (as fl_lightning/runtime/local_ray.py keeps it) for everything `ray up` starts,
# and this machine's pip configuration (package index) for the node's venv.
{
  echo "# fl_lightning selftest: keep Ray on loopback"
  echo "export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0"
  echo "export RAY_USAGE_STATS_REPORT_URL=http://127.0.0.1:9/ RAY_AUTH_MODE=disabled"
  echo "export RAY_TMPDIR=$WORK/n TMPDIR=$WORK/nt"
  env | grep -E '^PIP_[A-Z_]+=' | sed 's/^/export /; s/=\(.*\)$/="\1"/'
} >"$NODE_HOME/.fl_selftest_env"
{ echo '. ~/.fl_selftest_env'; cat "$NODE_HOME/.bashrc" 2>/dev/null; } >"$WORK/bashrc" &&
  install -m 644 -o "$NODE_USER" -g "$NODE_USER" "$WORK/bashrc" "$NODE_HOME/.bashrc"
chown "$NODE_USER:$NODE_USER" "$NODE_HOME/.fl_selftest_env"
for f in .config/pip/pip.conf .pip/pip.conf; do
  if [[ -f "$ROOT_HOME/$f" ]]; then
    install -d -o "$NODE_USER" -g "$NODE_USER" "$NODE_HOME/$(dirname "$f")" "$NODE_HOME/$(dirname "$(dirname "$f")")" 2>/dev/null
    install -m 644 -o "$NODE_USER" -g "$NODE_USER" "$ROOT_HOME/$f" "$NODE_HOME/$f"
  fi
done

free_ports() {
  "$PY" -I - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}
read -r SSH_PORT GCS_PORT DASH_PORT CLIENT_PORT AGENT_PORT TUNNEL_PORT <<<"$(free_ports 6)"
if "$PY" -I -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 8265))' 2>/dev/null; then
  TUNNEL_PORT=8265  # submit.sh's default address works as it is
fi

[[ -d /run/sshd ]] || { mkdir -p /run/sshd && chmod 755 /run/sshd && MADE_RUN_SSHD=1; }
cat >"$WORK/ssh/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $WORK/ssh/host_ed25519
PidFile $WORK/ssh/sshd.pid
AllowUsers $NODE_USER
AuthorizedKeysFile .ssh/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
UsePAM no
AllowTcpForwarding local
X11Forwarding no
PermitTunnel no
PrintMotd no
MaxSessions 64
MaxStartups 64
Subsystem sftp internal-sftp
EOF
/usr/sbin/sshd -t -f "$WORK/ssh/sshd_config" >"$WORK/logs/sshd_check.log" 2>&1 ||
  fail "node: sshd config rejected: $(tail -n 1 "$WORK/logs/sshd_check.log")"
/usr/sbin/sshd -D -e -f "$WORK/ssh/sshd_config" >"$WORK/logs/sshd.log" 2>&1 </dev/null &
SSHD_PID=$!

# `ssh` for the ray CLI: Ray's SSH runner has no port setting, so this adds our sshd's port.
printf '#!/bin/sh\nexec /usr/bin/ssh -o Port=%s "$@"\n' "$SSH_PORT" >"$WORK/bin/ssh"
chmod 755 "$WORK/bin/ssh"
SSH_OK=0
for _ in $(seq 1 50); do
  if "$WORK/bin/ssh" -i "$WORK/ssh/id_ed25519" -o BatchMode=yes -o IdentitiesOnly=yes \
       -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR \
       "$NODE_USER@127.0.0.1" true >>"$WORK/logs/ssh_check.log" 2>&1; then SSH_OK=1; break; fi
  kill -0 "$SSHD_PID" 2>/dev/null || break
  sleep 0.2
done
[[ $SSH_OK == 1 ]] || fail "node: cannot log in as $NODE_USER over ssh on 127.0.0.1:$SSH_PORT ($(tail -n 1 "$WORK/logs/sshd.log"))"
say "node: user $NODE_USER ($NODE_HOME), ed25519 key, sshd pid $SSHD_PID on 127.0.0.1:$SSH_PORT"

# The ray CLI here: loopback settings, a scratch HOME, RAY_TMPDIR (cluster state) and TMPDIR
# (config cache) below $WORK; our `ssh` first on PATH.
export PATH="$WORK/bin:$VENV/bin:$PATH"
export HOME="$WORK/home" RAY_TMPDIR="$WORK/l" TMPDIR="$WORK/t"
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
export RAY_USAGE_STATS_REPORT_URL=http://127.0.0.1:9/
echo "{}" >"$HOME/ray_bootstrap_config.yaml"
unset RAY_ADDRESS WANDB_API_KEY

# --- 2. the cluster config: ray_cluster.yaml with its CHANGE: values filled ----------------------
STEP="config"
CLUSTER_NAME="fl-selftest-$TAG"
CLUSTER_YAML="$WORK/ray_cluster.yaml"
"$PY" -I - "$REPO/ray_cluster.yaml" "$CLUSTER_YAML" "$CLUSTER_NAME" "$NODE_USER" "$WORK/ssh/id_ed25519" \
  "$GCS_PORT" "$DASH_PORT" "$CLIENT_PORT" "$AGENT_PORT" >"$WORK/logs/config.log" 2>&1 <<'PY' ||
import sys, yaml
src, dst, name, user, key, gcs, dash, client, agent = sys.argv[1:]
cfg = yaml.safe_load(open(src))
cfg["cluster_name"] = name                       # CHANGE (optional)
cfg["provider"]["head_ip"] = "127.0.0.1"         # CHANGE: ... 127.0.0.1 when you run `ray up` on it
cfg["provider"]["worker_ips"] = []               # CHANGE: [] for a single workstation
cfg["auth"]["ssh_user"] = user                   # CHANGE
cfg["auth"]["ssh_private_key"] = key             # CHANGE
def ports(cmd: str) -> str:                      # CHANGE (optional): the ports, taken here
    cmd = cmd.replace("--port=6379", f"--port={gcs}").replace("$RAY_HEAD_IP:6379", f"$RAY_HEAD_IP:{gcs}")
    cmd = cmd.replace("--dashboard-port=8265", f"--dashboard-port={dash}")
    if "ray start --head" in cmd:
        cmd += f" --ray-client-server-port={client} --dashboard-agent-listen-port={agent}"
    return cmd
for k in ("head_start_ray_commands", "worker_start_ray_commands"):
    cfg[k] = [ports(c) for c in cfg[k]]
text = yaml.safe_dump(cfg, sort_keys=False)
for placeholder in ("HEAD_IP", "WORKER_IP", "YOUR_SSH_USER", "6379", "8265"):
    assert placeholder not in text.replace("RAY_HEAD_IP", ""), f"{placeholder} still in the filled config"
open(dst, "w").write(text)
PY
  fail "config: filling ray_cluster.yaml failed: $(tail -n 1 "$WORK/logs/config.log")"
say "config: $CLUSTER_YAML (cluster $CLUSTER_NAME, head 127.0.0.1, GCS :$GCS_PORT, dashboard :$DASH_PORT)"

# --- 3. ray up -----------------------------------------------------------------------------------
STEP="ray up"
t=$SECONDS
RAY_IS_UP=1  # from here on the cleanup runs `ray down`
(cd "$REPO" && timeout 2400 "$RAYCLI" up -y --disable-usage-stats --no-config-cache "$CLUSTER_YAML") \
  >"$WORK/logs/ray_up.log" 2>&1 ||
  fail "ray up: exit $? ($(grep -v '^\s*$' "$WORK/logs/ray_up.log" | tail -n 1 | cut -c1-200))"
RAY_UP_S=$((SECONDS - t))
LISTEN="$("$PY" -I - "$NODE_UID" <<'PY'
import os, sys
uid = int(sys.argv[1])
def addrs():
    out = {}
    for name in ("tcp", "tcp6"):
        for line in open(f"/proc/net/{name}").read().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A":
                continue
            h = f[1].split(":")[0]
            if len(h) == 8:
                ip = ".".join(str(int(h[i:i + 2], 16)) for i in (6, 4, 2, 0))
            elif h.startswith("0000000000000000FFFF0000"):
                ip = ".".join(str(int(h[-8:][i:i + 2], 16)) for i in (6, 4, 2, 0))
            else:
                ip = "::1" if h == "00000000000000000000000001000000" else h
            out[f[9]] = ip
    return out
listen, found = addrs(), []
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        if os.stat(f"/proc/{pid}").st_uid != uid:
            continue
        for fd in os.listdir(f"/proc/{pid}/fd"):
            t = os.readlink(f"/proc/{pid}/fd/{fd}")
            if t.startswith("socket:[") and t[8:-1] in listen:
                found.append(listen[t[8:-1]])
    except OSError:
        continue
bad = sorted({a for a in found if a not in ("127.0.0.1", "::1")})
print(f"{len(found)} {','.join(bad) or 'none'}")
PY
)"
read -r N_LISTEN BAD_LISTEN <<<"$LISTEN"
[[ "$N_LISTEN" -gt 0 ]] || fail "ray up: no process of $NODE_USER listens anywhere: is the head running?"
[[ "$BAD_LISTEN" == none ]] || fail "ray up: the node's Ray listens beyond loopback: $BAD_LISTEN"
say "ray up: ${RAY_UP_S}s; the head's $N_LISTEN listening sockets are all on 127.0.0.1"
grep -iE "dashboard|8265|$DASH_PORT" "$WORK/logs/ray_up.log" | grep -v '^\s*$' | sed 's/\x1b\[[0-9;]*m//g' |
  tail -n 4 | sed 's/^/         ray up says: /'

# --- 4. the dashboard through SSH ----------------------------------------------------------------
STEP="ray dashboard"
setsid "$RAYCLI" dashboard --port "$TUNNEL_PORT" --remote-port "$DASH_PORT" --no-config-cache "$CLUSTER_YAML" \
  >"$WORK/logs/ray_dashboard.log" 2>&1 </dev/null &
DASH_PID=$!
ADDRESS="http://127.0.0.1:$TUNNEL_PORT"
UP=0
for _ in $(seq 1 120); do
  "$PY" -I -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/api/version", timeout=2)' "$ADDRESS" \
    2>/dev/null && { UP=1; break; }
  kill -0 "$DASH_PID" 2>/dev/null || break
  sleep 0.5
done
[[ $UP == 1 ]] || fail "ray dashboard: the tunnel to the head's 127.0.0.1:$DASH_PORT did not answer on $ADDRESS"
if [[ "$TUNNEL_PORT" == 8265 ]]; then
  SUBMIT=("$REPO/cluster/submit.sh")  # its default address
  say "ray dashboard: the head's dashboard on $ADDRESS (submit.sh's default)"
else
  SUBMIT=("$REPO/cluster/submit.sh" --address "$ADDRESS")
  say "ray dashboard: the head's dashboard on $ADDRESS (8265 is taken here: submit.sh --address)"
fi

# --- 5. run A: no output_dir ---------------------------------------------------------------------
NODE_RUNS="$NODE_HOME/fl_lightning_runs"
STEP="run A"
t=$SECONDS
timeout 900 "${SUBMIT[@]}" run "${RUN_ARGS[@]}" >"$WORK/logs/run_a.log" 2>&1 ||
  fail "run A: submit.sh exit $? ($(grep -E 'error|Error|failed' "$WORK/logs/run_a.log" | tail -n 1 | cut -c1-200))"
RUN_A_S=$((SECONDS - t))
RUN_A="$(tr '\r' '\n' <"$WORK/logs/run_a.log" | sed -n 's/^.*run dir: \([^ ]*\).*$/\1/p' | head -n 1)"
[[ -n "$RUN_A" ]] || fail "run A: the job printed no 'run dir:'"
[[ "$RUN_A" == /* ]] || fail "run A: the job printed a relative run dir ($RUN_A): it is in Ray's temporary package folder (fl_lightning.runtime.paths not wired into run)"
[[ "$RUN_A" == "$NODE_RUNS/runs/$EXPERIMENT/"* ]] || fail "run A: run dir $RUN_A is not under the node's FL_LIGHTNING_RUNS ($NODE_RUNS/runs/$EXPERIMENT)"
[[ -f "$RUN_A/summary.json" ]] || fail "run A: no summary.json in $RUN_A on the node"
say "run A: ${RUN_A_S}s, $(tr '\r' '\n' <"$WORK/logs/run_a.log" | grep -m1 'run dir:' | sed 's/^.*\(run dir:\)/\1/')"

# --- 6. run B: stopped after its first round, resumed through submit.sh --------------------------
STEP="run B"
"${SUBMIT[@]}" --no-wait run "${RUN_ARGS[@]}" logger=none >"$WORK/logs/run_b_submit.log" 2>&1 ||
  fail "run B: submit.sh --no-wait exit $?"
JOB_B="$(sed -n "s/.*Job '\([^']*\)' submitted successfully.*/\1/p" "$WORK/logs/run_b_submit.log" | head -n 1)"
[[ -n "$JOB_B" ]] || fail "run B: no job id in the submit output"
STOP="$("$PY" -I - "$ADDRESS" "$JOB_B" "$ROUNDS" 2>"$WORK/logs/run_b_stop.log" <<'PY'
import re, sys, time
from pathlib import Path
from ray.job_submission import JobStatus, JobSubmissionClient
url, job, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = JobSubmissionClient(url)
deadline, run_dir = time.time() + 600, None
while time.time() < deadline:
    status = client.get_job_status(job)
    if run_dir is None:
        m = re.search(r"run dir: (\S+)", client.get_job_logs(job))
        if m:
            run_dir = Path(m.group(1))
    if status.is_terminal():
        print(f"ERR the job ended ({status.value}) before its first round checkpoint"); sys.exit()
    if run_dir is not None and run_dir.is_absolute() and (run_dir / "checkpoints" / "round-000001.json").exists():
        break
    time.sleep(0.1 if run_dir is not None else 1.0)
else:
    print("ERR no round-1 checkpoint within 600 s"); sys.exit()
client.stop_job(job)  # what `ray job stop` sends
while not (status := client.get_job_status(job)).is_terminal():
    time.sleep(0.2)
print(f"OK {status.value} {run_dir}")
PY
)"
case "$STOP" in
  "OK STOPPED "*) RUN_B="${STOP#OK STOPPED }" ;;
  ERR*) fail "run B: ${STOP#ERR }" ;;
  "OK SUCCEEDED"*) fail "run B: finished before it could be stopped (more rounds: FL_SELFTEST_ROUNDS)" ;;
  *) fail "run B: stopping job $JOB_B gave '${STOP:-nothing}' ($(tail -n 1 "$WORK/logs/run_b_stop.log"))" ;;
esac
DONE_B="$(ls "$RUN_B/checkpoints" 2>/dev/null | sed -n 's/^round-0*\([0-9]*\)\.json$/\1/p' | sort -n | tail -n 1)"
[[ -n "$DONE_B" && "$DONE_B" -lt "$ROUNDS" ]] || fail "run B: after the stop its last checkpoint is round ${DONE_B:-none} of $ROUNDS"
say "run B: job $JOB_B stopped after round $DONE_B of $ROUNDS ($RUN_B)"
STEP="resume B"
t=$SECONDS
timeout 900 "${SUBMIT[@]}" resume "$RUN_B" >"$WORK/logs/run_b_resume.log" 2>&1 ||
  fail "resume B: submit.sh resume exit $? ($(grep -E 'error|Error' "$WORK/logs/run_b_resume.log" | tail -n 1 | cut -c1-200))"
grep -q "succeeded" "$WORK/logs/run_b_resume.log" || fail "resume B: the job did not succeed"
say "resume B: $((SECONDS - t))s: \`submit.sh resume $RUN_B\` continued from round $((DONE_B + 1))"

# --- 7. home: fetch, compare, identical ----------------------------------------------------------
STEP="fetch"
t=$SECONDS
(cd "$WORK/local" && RAY="$RAYCLI" "$REPO/cluster/fetch_runs.sh" "$CLUSTER_YAML" "$EXPERIMENT") \
  >"$WORK/logs/fetch.log" 2>&1 || fail "fetch: $(tail -n 1 "$WORK/logs/fetch.log")"
LOCAL_A="$WORK/local/runs/$EXPERIMENT/$(basename "$RUN_A")"
LOCAL_B="$WORK/local/runs/$EXPERIMENT/$(basename "$RUN_B")"
for d in "$LOCAL_A" "$LOCAL_B"; do
  for f in config.yaml metrics.jsonl summary.json partition.json checkpoints; do
    [[ -e "$d/$f" ]] || fail "fetch: $d/$f missing"
  done
done
ls -d "$LOCAL_A"/wandb/offline-run-* >/dev/null 2>&1 || fail "fetch: run A's W&B offline run ($LOCAL_A/wandb/offline-run-*) missing"
say "fetch: $((SECONDS - t))s, $(tail -n 1 "$WORK/logs/fetch.log" | sed "s|$WORK/local/||")"

STEP="compare"
(cd "$WORK/local" && PYTHONPATH="$REPO" MPLBACKEND=Agg "$PY" -m fl_lightning compare "runs/$EXPERIMENT") \
  >"$WORK/logs/compare.log" 2>&1 || fail "compare: exit $? ($(tail -n 1 "$WORK/logs/compare.log"))"
[[ -f "$WORK/local/runs/$EXPERIMENT/compare/compare.json" ]] || fail "compare: no compare/compare.json written"
sed 's/^/         /' "$WORK/logs/compare.log" | grep -v '^\s*$' | head -n 8
SAME="$("$PY" -I - "$LOCAL_A" "$LOCAL_B" "$ROUNDS" <<'PY'
import json, sys
from pathlib import Path
a, b, rounds = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
def load(d):
    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return json.loads((d / "summary.json").read_text()), [(r["round"], r["accuracy"], r.get("loss")) for r in recs]
(sa, ma), (sb, mb) = load(a), load(b)
if sb["rounds_completed"] != rounds or sa["rounds_completed"] != rounds:
    print(f"ERR rounds completed: A {sa['rounds_completed']}, B {sb['rounds_completed']}, want {rounds}")
elif ma != mb or sa["final_accuracy"] != sb["final_accuracy"]:
    print(f"ERR B (killed + resumed) differs from A: A {ma} / B {mb}")
else:
    print(f"OK final accuracy {sa['final_accuracy']:.4f} in both, {len(ma)} rounds identical")
PY
)"
[[ "$SAME" == OK* ]] || fail "compare: ${SAME#ERR }"
say "compare: B (stopped + resumed) == A: ${SAME#OK }"

# --- 8. ray down: the runs stay ------------------------------------------------------------------
STEP="ray down"
t=$SECONDS
kill -TERM -- "-$DASH_PID" 2>/dev/null; DASH_PID_OLD=$DASH_PID; DASH_PID=""
(cd "$REPO" && timeout 300 "$RAYCLI" down -y "$CLUSTER_YAML") >"$WORK/logs/ray_down.log" 2>&1 ||
  fail "ray down: exit $? ($(tail -n 1 "$WORK/logs/ray_down.log"))"
RAY_IS_UP=0
kill -KILL -- "-$DASH_PID_OLD" 2>/dev/null
for _ in $(seq 1 50); do [[ -z "$(pids_of_uid "$NODE_UID")" ]] && break; sleep 0.2; done
LEFT="$(pids_of_uid "$NODE_UID" | wc -l)"
[[ -f "$RUN_A/summary.json" && -f "$RUN_B/summary.json" ]] || fail "ray down: the runs are gone from the node"
say "ray down: $((SECONDS - t))s; $LEFT processes of $NODE_USER left; both runs still in $NODE_RUNS/runs/$EXPERIMENT"
[[ "$LEFT" == 0 ]] || fail "ray down: $LEFT processes of $NODE_USER still running after ray down"
STEP="cleanup"
say "total: $((SECONDS - T0))s"
