#!/usr/bin/python3
"""Emulated hosts on one machine, for multi-host MPI tests (issue 13).

    with Hosts(n=4, prefix="pcmh") as hosts:
        hosts.run_on(1, ["sh", "-c", "echo hi > /tmp/x"])
        hf = hosts.hostfile(slots=1)
        hosts.run_on(0, ["mpirun", "--hostfile", hf, *hosts.mpirun_args(),
                         "-np", "4", "hostname"])

Design
------
Network. Every host i is a network namespace `<prefix>-<pid>-h<i>` with `lo`
and one `eth0`. The eth0s are veth pairs whose other ends (`p<i>`) sit on a
bridge `br0` in an extra "switch" namespace `<prefix>-<pid>-sw`. The links
are created directly inside those namespaces (`ip -n SW link add ... peer
name eth0 netns H`), so the root namespace's network is never touched.
Host i gets 10.213.<octet>.<i+1>/24 (the harness picks them; traffic only
flows between them). Setup ends with a TCP connect from every host to host 0.

Filesystem. Each host has a private /tmp, a private /dev/shm, its own
/etc/hosts (naming every emulated host) and a private run folder mounted at
the same path `run_path` on every host (default /srv/pipec-run/<token>). The
host's files live under the scratch folder /var/tmp/pipec-netns-<token>/h<i>/
(`hosts.dir(i)` is its run folder as seen from outside). Every process
started on a host is wrapped by `SCRATCH/bin/host<i>`:

    ip netns exec H unshare --mount --uts --propagation private sh -c \
      'hostname NAME; mount --bind HOSTDIR/tmp /tmp; mount --bind ... run_path;
       cd run_path; exec "$@"'

so the mounts exist only inside the process's own mount namespace (and its
children's): nothing is mounted in the root mount namespace and there is
nothing to unmount. The rest of the filesystem (the binaries, /var/tmp) is
shared, as an NFS-less cluster with identical installs would be. The scratch
folder is deliberately not under /tmp, which each host replaces.

Hostname. Each host process also gets its own UTS namespace with hostname
`<prefix><i>`: OpenMPI's daemons report their node name, and hosts that
all called themselves the same would look like one node.

Launching. `SCRATCH/bin/rsh-agent` is an ssh stand-in for OpenMPI's rsh
launcher (`--mca plm_rsh_agent SCRATCH/bin/rsh-agent`, in
`hosts.mpirun_args()`). OpenMPI 4.1 runs it as `AGENT HOST WORD...`
(the remote command is several words; ssh joins them with spaces and hands
the line to the login shell; so does the agent, so one string or many
words both work; leading ssh-style options are skipped). HOST is an
address or a name of an emulated host. Like ssh, the agent starts the
remote command with a clean environment (HOME, USER, LOGNAME, SHELL, PATH
only), so a test notices a variable that OpenMPI does not forward. Every
invocation is logged to SCRATCH/agent.log. mpirun runs on host 0, so host 0
is local to it (it matches its own address) and hosts 1.. are remote.

Environment. Only the launching host's ranks inherit mpirun's environment;
remote ranks get what OpenMPI forwards. In OpenMPI 4.1.4 `-x VAR` placed
before the first app context of an MPMD line (`A : B : C`) reaches app
context 0 only; `--mca mca_base_env_list "A;B=v"` (mpirun_args(forward_env=))
or a `-x` in every app context reach all of them.

Cleanup. `__exit__` (also on exceptions, KeyboardInterrupt, and SIGTERM/SIGHUP,
which are turned into SystemExit while the context is open) kills every
process left in the namespaces, deletes the namespaces (which deletes the
veths), removes the scratch folder and the run-path mount point.
`cleanup_stale(prefix)` removes namespaces left by a harness process that no
longer exists (e.g. one killed with SIGKILL).

`available()` returns (True, "") or (False, reason) when namespaces cannot be
created here (not root, no `ip`/`unshare`/`mount`, no permission).

Self-test: `/usr/bin/python3 test/e2e/netns_hosts.py [--hosts 4]` checks
that the ranks of an `mpirun -np N` run on N different namespaces and that
/tmp files are private to a host.
"""

import atexit
import ipaddress
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _ip(*args, check=True, ns=None):
    cmd = ["ip"] + (["-n", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    if check and r.returncode != 0:
        raise RuntimeError("%s: %s" % (" ".join(cmd), r.stderr.strip()))
    return r


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def available():
    """(True, "") when emulated hosts can be created here, else (False, why)."""
    if sys.platform != "linux":
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "needs root (network and mount namespaces)"
    for tool in ("ip", "unshare", "mount", "hostname"):
        if not shutil.which(tool):
            return False, "'%s' not found (install iproute2/util-linux)" % tool
    if not os.path.exists("/proc/self/ns/net"):
        return False, "kernel without network namespaces"
    name = "pcprobe-%d" % os.getpid()
    r = _ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return False, "cannot create a network namespace: " + r.stderr.strip()
    try:
        r = _ip("link", "add", "br0", "type", "bridge", ns=name, check=False)
        if r.returncode != 0:
            return False, "cannot create a bridge: " + r.stderr.strip()
        r = subprocess.run(
            ["ip", "netns", "exec", name, "unshare", "--mount", "--uts",
             "--propagation", "private", "sh", "-c",
             "hostname probe && mount -t tmpfs none /mnt"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            return False, ("cannot create mount/UTS namespaces: "
                           + r.stdout.strip())
    finally:
        _ip("netns", "del", name, check=False)
    return True, ""


def cleanup_stale(prefix, scratch_base="/var/tmp", run_base="/srv/pipec-run"):
    """Removes what a harness with this prefix left behind when it could not
    clean up (killed with SIGKILL): namespaces `<prefix>-<pid>-*`, scratch
    folders `<scratch_base>/pipec-netns-<prefix>-<pid>.*` and default run
    mount points `<run_base>/<prefix>-<pid>`, for pids no longer alive."""
    def stale(token):  # "<pid>" or "<pid>-...", after "<prefix>-"
        head = token.split("-")[0].split(".")[0]
        return head.isdigit() and not _pid_alive(int(head))
    r = _ip("netns", "list", check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix + "-") and stale(name[len(prefix) + 1:]):
            _kill_netns_pids(name)
            _ip("netns", "del", name, check=False)
    for base, lead in ((scratch_base, "pipec-netns-%s-" % prefix),
                       (run_base, "%s-" % prefix)):
        try:
            entries = os.listdir(base)
        except OSError:
            continue
        for e in entries:
            if e.startswith(lead) and stale(e[len(lead):]):
                path = os.path.join(base, e)
                if base == run_base:
                    try:
                        os.rmdir(path)  # only an empty mount point
                    except OSError:
                        pass
                else:
                    shutil.rmtree(path, ignore_errors=True)
    try:
        os.rmdir(run_base)  # only when empty (no other harness uses it)
    except OSError:
        pass


def shared_workdir(requested, stem, pipec):
    """A fresh work folder every emulated host sees (`requested`, or
    /var/tmp/<stem>-<pid> when it lies under /tmp, which every host
    replaces with its own), with a copy of the `pipec` driver in it (a
    checkout under /tmp would be hidden from the hosts; pipec train needs
    only itself and OUT/). Returns (folder, driver)."""
    work = os.path.abspath(requested)
    if work == "/tmp" or work.startswith("/tmp/"):
        work = "/var/tmp/%s-%d" % (stem, os.getpid())
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    shutil.copy2(os.path.abspath(pipec), os.path.join(work, "pipec"))
    return work, os.path.join(work, "pipec")


def _kill_netns_pids(ns):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        r = _ip("netns", "pids", ns, check=False)
        pids = [int(p) for p in r.stdout.split() if p.isdigit()]
        pids = [p for p in pids if p != os.getpid()]
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            r = _ip("netns", "pids", ns, check=False)
            if not [p for p in r.stdout.split() if p.isdigit()]:
                return
            time.sleep(0.1)


class Hosts:
    """`n` emulated hosts; see the module docstring."""

    def __init__(self, n=4, prefix="pcmh", run_path=None, octet=13,
                 scratch_base="/var/tmp", clean_env=True, keep=False):
        if n < 1:
            raise ValueError("n must be >= 1")
        if n > 250:
            raise ValueError("at most 250 hosts on one /24")
        self.n = n
        self.prefix = prefix
        self.token = "%s-%d" % (prefix, os.getpid())
        self.network = ipaddress.ip_network("10.213.%d.0/24" % octet)
        self.subnet = str(self.network)
        self.addrs = [str(self.network.network_address + i + 1)
                      for i in range(n)]
        self.names = ["%s%d" % (prefix, i) for i in range(n)]
        self.netns = ["%s-h%d" % (self.token, i) for i in range(n)]
        self.switch = "%s-sw" % self.token
        self.run_path = os.path.abspath(
            run_path or os.path.join("/srv/pipec-run", self.token))
        self.scratch_base = scratch_base
        self.clean_env = clean_env
        self.keep = keep  # leave everything in place (debugging)
        self.scratch = None
        self._created_ns = []
        self._created_dirs = []
        self._old_handlers = {}
        self._closed = True

    # -- paths -------------------------------------------------------------
    def hostdir(self, i):
        """Host i's private files as seen from outside (tmp/, run/, shm/)."""
        return os.path.join(self.scratch, "h%d" % i)

    def dir(self, i):
        """Host i's run folder (`run_path` on host i) as seen from outside."""
        return os.path.join(self.hostdir(i), "run")

    def tmp(self, i):
        """Host i's /tmp as seen from outside."""
        return os.path.join(self.hostdir(i), "tmp")

    def outside(self, i, path):
        """Where host i's `path` (under run_path or /tmp) lies outside."""
        path = os.path.abspath(path)
        for root, mine in ((self.run_path, self.dir(i)), ("/tmp", self.tmp(i))):
            if path == root or path.startswith(root + "/"):
                return mine + path[len(root):]
        return path  # shared part of the filesystem

    def wrapper(self, i):
        """The command prefix that runs argv on host i."""
        return os.path.join(self.scratch, "bin", "host%d" % i)

    @property
    def agent(self):
        return os.path.join(self.scratch, "bin", "rsh-agent")

    @property
    def agent_log(self):
        return os.path.join(self.scratch, "agent.log")

    # -- set-up ------------------------------------------------------------
    def __enter__(self):
        ok, why = available()
        if not ok:
            raise RuntimeError("emulated hosts unavailable: " + why)
        self._closed = False
        atexit.register(self.close)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        try:
            cleanup_stale(self.prefix, self.scratch_base)
            self._make_files()
            self._make_network()
            self.check_network()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _on_signal(self, signum, frame):
        raise SystemExit(128 + signum)

    def _make_files(self):
        os.makedirs(self.scratch_base, exist_ok=True)
        self.scratch = tempfile.mkdtemp(prefix="pipec-netns-%s." % self.token,
                                        dir=self.scratch_base)
        for bad in ("/tmp", self.run_path):
            if self.scratch == bad or self.scratch.startswith(bad + "/"):
                raise ValueError("scratch folder %s must not lie under %s, "
                                 "which every host replaces" %
                                 (self.scratch, bad))
        if self.run_path in ("/", "/tmp") or self.run_path.startswith("/tmp/"):
            raise ValueError("run_path %s must not be / or under /tmp"
                             % self.run_path)
        # The mount point must exist in the shared filesystem.
        missing = []
        p = self.run_path
        while not os.path.exists(p):
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            for attempt in range(3):  # a parent may vanish under a
                try:                  # concurrent harness's clean-up
                    os.makedirs(os.path.dirname(d), exist_ok=True)
                    os.mkdir(d)
                    break
                except FileNotFoundError:
                    if attempt == 2:
                        raise
                except FileExistsError:
                    break
            self._created_dirs.append(d)
        os.makedirs(os.path.join(self.scratch, "bin"))
        hosts_lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost"]
        hosts_lines += ["%s\t%s" % (a, n) for a, n in zip(self.addrs,
                                                          self.names)]
        shell = pwd.getpwuid(os.geteuid()).pw_shell or "/bin/sh"
        if not os.access(shell, os.X_OK):
            shell = "/bin/sh"
        self.login_shell = shell
        for i in range(self.n):
            h = self.hostdir(i)
            for sub in ("tmp", "run", "shm"):
                os.makedirs(os.path.join(h, sub))
            os.chmod(os.path.join(h, "tmp"), 0o1777)
            os.chmod(os.path.join(h, "shm"), 0o1777)
            with open(os.path.join(h, "hosts"), "w") as f:
                f.write("\n".join(hosts_lines) + "\n")
            mounts = [(os.path.join(h, "tmp"), "/tmp"),
                      (os.path.join(h, "shm"), "/dev/shm"),
                      (os.path.join(h, "run"), self.run_path)]
            if os.path.exists("/etc/hosts"):
                mounts.append((os.path.join(h, "hosts"), "/etc/hosts"))
            inner = ["hostname %s" % shlex.quote(self.names[i])]
            inner += ["mount --bind %s %s" % (shlex.quote(s), shlex.quote(d))
                      for s, d in mounts if os.path.exists(d)]
            inner.append('if [ "$1" = -C ]; then cd "$2" && shift 2; '
                         'else cd %s; fi' % shlex.quote(self.run_path))
            inner.append('exec "$@"')
            script = (
                "#!/bin/sh\n"
                "# Runs ARGV on emulated host %d (%s, %s).\n"
                "# usage: host%d [-C DIR] ARGV...\n"
                "exec ip netns exec %s unshare --mount --uts --propagation "
                "private /bin/sh -c %s host%d \"$@\"\n"
                % (i, self.names[i], self.addrs[i], i, self.netns[i],
                   shlex.quote(" && ".join(inner[:-2]) + "\n"
                               + "\n".join(inner[-2:])), i))
            self._write_exec(self.wrapper(i), script)
        # The rsh agent: AGENT [ssh options] HOST WORD...
        cases = []
        for i in range(self.n):
            pats = [self.addrs[i], self.names[i]]
            cases.append("  %s) w=%s ;;" % (
                "|".join(shlex.quote(p) for p in pats),
                shlex.quote(self.wrapper(i))))
        if self.clean_env:
            env = ("env -i HOME=\"${HOME:-/root}\" USER=\"$user\" "
                   "LOGNAME=\"$user\" SHELL=%s PATH=%s " %
                   (shlex.quote(shell), DEFAULT_PATH))
        else:
            env = ""
        agent = """#!/bin/sh
# ssh stand-in for OpenMPI's rsh launcher: AGENT [ssh options] HOST WORD...
# Runs the words, joined by spaces, with the login shell on HOST's view.
log=%(log)s
{ printf 'agent pid %%s argc %%s:' $$ $#; for a in "$@"; do printf ' [%%s]' "$a"; done; echo; } >>"$log" 2>/dev/null
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-l|-i|-F|-E|-b|-c|-m|-J) shift 2 ;;
    --) shift; break ;;
    -*) shift ;;
    *) break ;;
  esac
done
[ $# -ge 1 ] || { echo "rsh-agent: no host" >&2; exit 255; }
host=$1; shift
host=${host#*@}
case "$host" in
%(cases)s
  *) echo "rsh-agent: unknown host '$host'" >&2; exit 255 ;;
esac
user=$(id -un)
[ $# -ge 1 ] || { echo "rsh-agent: no command (interactive login unsupported)" >&2; exit 255; }
exec "$w" -C "${HOME:-/}" %(env)s%(shell)s -c "$*"
""" % {"log": shlex.quote(self.agent_log), "cases": "\n".join(cases),
       "env": env, "shell": shlex.quote(shell)}
        self._write_exec(self.agent, agent)

    @staticmethod
    def _write_exec(path, text):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, 0o755)

    def _make_network(self):
        sw = self.switch
        _ip("netns", "add", sw)
        self._created_ns.append(sw)
        _ip("link", "set", "lo", "up", ns=sw)
        _ip("link", "add", "br0", "type", "bridge", ns=sw)
        _ip("link", "set", "br0", "up", ns=sw)
        for i in range(self.n):
            h = self.netns[i]
            _ip("netns", "add", h)
            self._created_ns.append(h)
            port = "p%d" % i
            _ip("link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", h, ns=sw)
            _ip("link", "set", port, "master", "br0", ns=sw)
            _ip("link", "set", port, "up", ns=sw)
            _ip("link", "set", "lo", "up", ns=h)
            _ip("addr", "add", "%s/%d" % (self.addrs[i], self.network.prefixlen),
                "dev", "eth0", ns=h)
            _ip("link", "set", "eth0", "up", ns=h)

    def check_network(self, timeout=10.0):
        """TCP connect from every host to host 0 (and 1 -> n-1)."""
        if self.n < 2:
            return
        port = 47000 + os.getpid() % 1000
        server = subprocess.Popen(
            [self.wrapper(0), sys.executable, "-c",
             "import socket,sys\n"
             "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             "s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)\n"
             "print('ready', flush=True)\n"
             "for _ in range(int(sys.argv[3])):\n"
             "    c, a = s.accept(); c.sendall(b'h0'); c.close()\n",
             self.addrs[0], str(port), str(self.n - 1)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError("check_network: server on host 0 failed: "
                                   + server.stderr.read())
            client = ("import socket,sys,time\n"
                      "end=time.time()+%f\n"
                      "while True:\n"
                      "    try:\n"
                      "        c=socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)\n"
                      "        break\n"
                      "    except OSError:\n"
                      "        if time.time()>end: raise\n"
                      "        time.sleep(0.1)\n"
                      "assert c.recv(2)==b'h0'\n" % timeout)
            for i in range(1, self.n):
                r = self.run_on(i, [sys.executable, "-c", client,
                                    self.addrs[0], str(port)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=timeout + 5)
                if r.returncode != 0:
                    raise RuntimeError("check_network: host %d cannot reach "
                                       "host 0 %s:%d: %s" % (
                                           i, self.addrs[0], port, r.stdout))
            server.wait(timeout=timeout)
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()

    # -- use ---------------------------------------------------------------
    def argv_on(self, i, argv, cwd=None):
        """argv that runs `argv` on host i (cwd inside the host's view,
        default run_path)."""
        pre = [self.wrapper(i)]
        if cwd:
            pre += ["-C", cwd]
        return pre + list(argv)

    def run_on(self, i, argv, cwd=None, **kw):
        """subprocess.run(argv) on host i (namespace and mount view)."""
        return subprocess.run(self.argv_on(i, argv, cwd), **kw)

    def popen_on(self, i, argv, cwd=None, **kw):
        return subprocess.Popen(self.argv_on(i, argv, cwd), **kw)

    def install(self, path, src, files=()):
        """A fresh copy of folder `src` at `path` (under run_path) on every
        host, with `files` copied into it (a run folder and its data, as
        each machine of a cluster without a shared filesystem holds it)."""
        for i in range(self.n):
            dst = self.outside(i, path)
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
            for f in files:
                shutil.copy(f, dst)

    def hostfile(self, slots=1, hosts=None, names=False, path=None):
        """Writes an OpenMPI hostfile (`ADDR slots=K` per host) in the
        shared scratch folder; returns its path."""
        hosts = range(self.n) if hosts is None else hosts
        path = path or os.path.join(self.scratch, "hostfile")
        with open(path, "w") as f:
            for i in hosts:
                f.write("%s slots=%d\n" % (
                    self.names[i] if names else self.addrs[i], slots))
        return path

    def mpirun_args(self, tree_spawn=False, forward_env=()):
        """mpirun options for a job over the emulated hosts (TCP only).
        `forward_env` names variables to pass to every rank on every host
        (mca_base_env_list: a `-x VAR` before the first app context of an
        MPMD line reaches app context 0 only)."""
        args = ["--allow-run-as-root",
                "--mca", "plm_rsh_agent", self.agent,
                "--mca", "btl", "tcp,self",
                "--mca", "btl_tcp_if_include", self.subnet,
                "--mca", "oob_tcp_if_include", self.subnet]
        if not tree_spawn:
            args += ["--mca", "plm_rsh_no_tree_spawn", "1"]
        if forward_env:
            args += ["--mca", "mca_base_env_list", ";".join(forward_env)]
        return args

    def mpi_env(self, base=None):
        env = dict(os.environ if base is None else base)
        env.update(MPI_ENV)
        return env

    # -- clean-up ----------------------------------------------------------
    def close(self):
        if self._closed:
            return
        self._closed = True
        for sig, h in self._old_handlers.items():
            try:
                signal.signal(sig, h)
            except (ValueError, TypeError):
                pass
        self._old_handlers = {}
        try:
            atexit.unregister(self.close)
        except Exception:
            pass
        if self.keep:
            sys.stderr.write("netns_hosts: keeping %s and namespaces %s\n" % (
                self.scratch, " ".join(self._created_ns)))
            return
        # Ignore Ctrl-C while cleaning up, so that it completes.
        old_int = None
        if threading.current_thread() is threading.main_thread():
            old_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for ns in reversed(self._created_ns):
                _kill_netns_pids(ns)
            for ns in reversed(self._created_ns):
                _ip("netns", "del", ns, check=False)
            self._created_ns = []
            if self.scratch:
                shutil.rmtree(self.scratch, ignore_errors=True)
            for d in reversed(self._created_dirs):
                try:
                    os.rmdir(d)
                except OSError:
                    pass
            self._created_dirs = []
        finally:
            if old_int is not None:
                signal.signal(signal.SIGINT, old_int)


def _selftest(n):
    ok, why = available()
    if not ok:
        print("SKIP: " + why)
        return 0
    with Hosts(n=n, prefix="pcst") as hosts:
        # /tmp and the run folder are private.
        marker = "/tmp/netns-hosts-marker-%d" % os.getpid()
        hosts.run_on(1, ["sh", "-c", "echo one > %s; echo one > marker"
                         % marker], check=True)
        for i in range(hosts.n):
            r = hosts.run_on(i, ["sh", "-c", "cat %s marker 2>&1; hostname"
                                 % marker], stdout=subprocess.PIPE, text=True)
            print("host %d: %s" % (i, " | ".join(r.stdout.split("\n"))))
            seen = "one" in r.stdout
            assert seen == (i == 1), "host %d sees host 1's files" % i
        assert os.path.exists(hosts.outside(1, marker))
        assert not os.path.exists(marker), "host 1's /tmp is the machine's"
        # mpirun on host 0, one rank per host, each in its own namespace.
        hf = hosts.hostfile(slots=1)
        cmd = ["mpirun", "--hostfile", hf] + hosts.mpirun_args() + [
            "-np", str(n), "sh", "-c",
            'echo "rank=$OMPI_COMM_WORLD_RANK host=$(hostname) '
            'netns=$(readlink /proc/self/ns/net) '
            'addr=$(ip -4 -o addr show dev eth0 | awk \'{print $4}\') '
            'tmp=$(cat %s 2>/dev/null || echo -)"' % marker]
        r = hosts.run_on(0, cmd, env=hosts.mpi_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=120)
        print(r.stdout, end="")
        if r.returncode != 0:
            print("FAIL: mpirun exit %d" % r.returncode)
            print(open(hosts.agent_log).read())
            return 1
        lines = [l for l in r.stdout.splitlines() if l.startswith("rank=")]
        fields = [dict(kv.split("=", 1) for kv in l.split()) for l in lines]
        assert len(fields) == n, "expected %d rank lines" % n
        assert len({f["netns"] for f in fields}) == n, "ranks share a netns"
        assert len({f["addr"] for f in fields}) == n, "ranks share an address"
        for f in fields:
            want = "one" if f["addr"].split("/")[0] == hosts.addrs[1] else "-"
            assert f["tmp"] == want, f
        print("agent invocations:")
        print(open(hosts.agent_log).read(), end="")
    print("PASS")
    return 0


if __name__ == "__main__":
    import argparse
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hosts", type=int, default=4)
    n = p.parse_args().hosts
    if n < 2:
        p.error("--hosts must be at least 2")
    sys.exit(_selftest(n))
