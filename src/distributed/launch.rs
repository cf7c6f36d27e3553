//! `mlxbar cluster launch`: starts every rank a host file names, as `mlx.launch` does:
//! entries whose `ssh` names this machine as local processes, the others over `ssh`
//! (checked first: the binary, the host file and the model must exist there). It stays in
//! front while they run, each rank's log lines prefixed with its rank; when one ends, or
//! on Ctrl-C / SIGTERM, it stops the others (with `--on-rank-lost rejoin` among serve's
//! flags, a rank killed by a signal is started again instead: the others wait for it).
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::hostfile::{Hostfile, RING_PORT};

#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// MLX's host file, as mlx.distributed_config writes it: {"backend": "ring", "hosts":
    /// [{"ssh": "host", "ips": ["10.0.0.1"]}, ...]}, one host entry per rank
    #[arg(long)]
    pub hostfile: PathBuf,
    /// The ring's first port, one more per rank and IP (jaccl: its coordinator's port)
    #[arg(long, default_value_t = RING_PORT)]
    pub ring_port: u16,
    /// `mlxbar` on the other hosts [default: this binary's path]
    #[arg(long)]
    pub remote_binary: Option<String>,
    /// How long the ranks may take to stop once asked
    #[arg(long, default_value_t = 30.0)]
    pub stop_seconds: f64,
    /// `mlxbar serve`'s flags for every rank, after `--` (e.g. -- --model M --port 8080)
    #[arg(last = true)]
    pub serve: Vec<String>,
}

#[derive(clap::Subcommand)]
pub enum ClusterCommand {
    /// Start every rank of a host file and wait for them (rank 0 serves HTTP)
    Launch(LaunchArgs),
}

/// Whether a host file's `ssh` names this machine.
pub fn is_local(host: &str) -> bool {
    let own = hostname();
    matches!(host, "localhost" | "127.0.0.1" | "::1") || own.as_deref().is_some_and(|h| h == host || h.split('.').next() == Some(host))
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| Command::new("hostname").output().ok().and_then(|o| String::from_utf8(o.stdout).ok()))
        .map(|h| h.trim().to_string())
}

pub fn run(args: LaunchArgs) -> Result<()> {
    let hostfile = std::fs::canonicalize(&args.hostfile).with_context(|| format!("host file {}", args.hostfile.display()))?;
    let hosts = Hostfile::read(&hostfile)?;
    hosts.backend_env(0, args.ring_port)?;
    if args.serve.iter().any(|a| a == "--hostfile" || a == "--rank" || a.starts_with("--hostfile=") || a.starts_with("--rank=")) {
        bail!("launch sets --hostfile and --rank for each rank; pass only serve's other flags after --");
    }
    let binary = std::env::current_exe().context("this binary's path")?;
    let remote = args.remote_binary.clone().unwrap_or_else(|| binary.display().to_string());
    let model = flag_value(&args.serve, "--model");
    for (rank, h) in hosts.hosts.iter().enumerate().filter(|(_, h)| !is_local(&h.ssh)) {
        check_remote(rank, &h.ssh, &remote, &hostfile, model.as_deref())?;
    }
    if let Some(m) = &model {
        if !Path::new(m).exists() {
            bail!("--model {m} does not exist on this machine (rank 0's)");
        }
    }
    let (lines, logs) = mpsc::channel::<(usize, Option<String>)>();
    let commands: Vec<(usize, Vec<String>)> = hosts
        .hosts
        .iter()
        .enumerate()
        .map(|(rank, _)| {
            let mut serve: Vec<String> = vec!["serve".into(), "--hostfile".into(), hostfile.display().to_string()];
            serve.extend(["--rank".into(), rank.to_string(), "--ring-port".into(), args.ring_port.to_string()]);
            serve.extend(args.serve.iter().cloned());
            (rank, serve)
        })
        .collect();
    let start = |rank: usize| -> Result<Child> {
        let (h, serve) = (&hosts.hosts[rank], &commands[rank].1);
        let mut cmd = if is_local(&h.ssh) {
            let mut c = Command::new(&binary);
            c.args(serve);
            // Its own process group: Ctrl-C in the terminal reaches only the launcher, which
            // stops rank 0 first (stopping every rank at once would tear the ring mid-stop).
            #[cfg(unix)]
            std::os::unix::process::CommandExt::process_group(&mut c, 0);
            c
        } else {
            // -tt: the remote rank gets a terminal, so it is hung up on (and stops) when this
            // ssh ends, as stopping it here does.
            let mut c = Command::new("ssh");
            c.args(["-tt", "-o", "BatchMode=yes", &h.ssh, &shell_words(&remote, serve)]);
            c
        };
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting rank {rank} on {}", h.ssh))?;
        for pipe in
            [child.stdout.take().map(|p| Box::new(p) as Box<dyn std::io::Read + Send>), child.stderr.take().map(|p| Box::new(p) as _)]
                .into_iter()
                .flatten()
        {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = lines.send((rank, Some(line)));
                }
                let _ = lines.send((rank, None));
            });
        }
        Ok(child)
    };
    let mut children: Vec<(usize, Child)> = vec![];
    // The highest rank first, rank 0 last: rank 0 serves as soon as the ring is up.
    for rank in (0..hosts.hosts.len()).rev() {
        match start(rank) {
            Ok(child) => children.push((rank, child)),
            Err(e) => {
                stop_all(&mut children, Duration::from_secs_f64(args.stop_seconds));
                return Err(e);
            }
        }
    }
    // --on-rank-lost rejoin: a rank that ends is started again (the others restart
    // themselves and wait for it); else the first to end stops them all.
    let rejoin = flag_value(&args.serve, "--on-rank-lost").as_deref() == Some("rejoin");
    // A rank that keeps ending soon after its start (a bad flag, a missing model) is given
    // up after a few tries rather than started in a loop.
    let mut started: Vec<(std::time::Instant, u32)> = vec![(std::time::Instant::now(), 0); hosts.hosts.len()];
    let stop = stop_signal();
    let mut first_exit: Option<(usize, std::process::ExitStatus)> = None;
    while first_exit.is_none() && stop.try_recv().is_err() {
        match logs.recv_timeout(Duration::from_millis(200)) {
            Ok((rank, Some(line))) => eprintln!("[rank {rank}] {line}"),
            Ok((_, None)) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        for (rank, child) in &mut children {
            let Ok(Some(status)) = child.try_wait() else { continue };
            // Under rejoin a rank restarts itself for what a restart can cure; one that ends
            // was stopped (SIGTERM, Ctrl-C), refused or failed for good: as without rejoin,
            // unless something killed it (the OOM killer, a kill -9), which a restart cures.
            if !rejoin || !killed(status) {
                first_exit = Some((*rank, status));
                continue;
            }
            let (at, quick) = &mut started[*rank];
            *quick = if at.elapsed() < QUICK_EXIT { *quick + 1 } else { 0 };
            if *quick >= QUICK_EXITS {
                eprintln!(
                    "[launch] rank {rank} exited ({status}) {QUICK_EXITS} times within {} s of starting; giving up",
                    QUICK_EXIT.as_secs()
                );
                first_exit = Some((*rank, status));
                continue;
            }
            eprintln!("[launch] rank {rank} exited ({status}); starting it again (--on-rank-lost rejoin)");
            *at = std::time::Instant::now();
            match start(*rank) {
                Ok(again) => *child = again,
                Err(e) => {
                    eprintln!("[launch] {e:#}");
                    first_exit = Some((*rank, status));
                }
            }
        }
    }
    drop(lines);
    stop_all(&mut children, Duration::from_secs_f64(args.stop_seconds));
    while let Ok((rank, Some(line))) = logs.recv_timeout(Duration::from_millis(100)) {
        eprintln!("[rank {rank}] {line}");
    }
    match first_exit {
        Some((rank, status)) if !status.success() => bail!("rank {rank} exited ({status}); the other ranks were stopped"),
        _ => Ok(()),
    }
}

/// Whether a rank was killed by a signal other than a request to stop.
fn killed(status: std::process::ExitStatus) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        status.signal().is_some_and(|s| s != libc::SIGTERM && s != libc::SIGINT)
    }
    #[cfg(not(unix))]
    {
        let _ = status;
        false
    }
}

/// `--on-rank-lost rejoin`: a rank that ends this soon after its start, this many times in
/// a row, is not started again.
const QUICK_EXIT: Duration = Duration::from_secs(10);
const QUICK_EXITS: u32 = 5;

/// SIGTERM to rank 0 (it tells the others to stop and waits until the stop went round),
/// then to every rank still running once it is gone, then SIGKILL past `grace`.
fn stop_all(children: &mut [(usize, Child)], grace: Duration) {
    children.sort_by_key(|(rank, _)| *rank);
    let deadline = std::time::Instant::now() + grace;
    for (i, (_, child)) in children.iter_mut().enumerate() {
        if let Ok(None) = child.try_wait() {
            // SAFETY: kill(2) with a pid this process spawned and has not reaped.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
        }
        while i == 0 && matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    for (rank, child) in children.iter_mut() {
        while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if let Ok(None) = child.try_wait() {
            tracing::warn!("rank {rank} did not stop within {grace:?}; killing it");
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

/// Fires on Ctrl-C or SIGTERM.
fn stop_signal() -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async {
            #[cfg(unix)]
            {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
        });
        let _ = tx.send(());
    });
    rx
}

/// The remote host has the binary, the host file (same path) and the model.
fn check_remote(rank: usize, host: &str, binary: &str, hostfile: &Path, model: Option<&str>) -> Result<()> {
    let mut checks = vec![format!("command -v {} >/dev/null || {{ echo 'no mlxbar at {binary}'; exit 1; }}", quote(binary))];
    checks.push(format!(
        "test -f {} || {{ echo 'no host file at {}'; exit 1; }}",
        quote(&hostfile.display().to_string()),
        hostfile.display()
    ));
    if let Some(m) = model {
        checks.push(format!("test -e {} || {{ echo 'no model at {m}'; exit 1; }}", quote(m)));
    }
    let out = Command::new("ssh")
        .args(["-o", "BatchMode=yes", "-o", "ConnectTimeout=10", host, &checks.join(" && ")])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running ssh for rank {rank} ({host})"))?;
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        bail!("rank {rank} ({host}): {}", if said.is_empty() { err } else { said });
    }
    Ok(())
}

fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let eq = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(&eq) {
        Some(v) => Some(v.to_string()),
        None if a == flag => args.get(i + 1).cloned(),
        None => None,
    })
}

/// A POSIX shell word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn shell_words(program: &str, args: &[String]) -> String {
    std::iter::once(program).chain(args.iter().map(String::as_str)).map(quote).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_names_and_shell_quoting() {
        assert!(is_local("localhost") && is_local("127.0.0.1"));
        assert!(!is_local("mac-b.example.invalid"));
        if let Some(h) = hostname() {
            assert!(is_local(&h));
        }
        assert_eq!(shell_words("mlxbar", &["--model".into(), "/a b/it's.gguf".into()]), r"'mlxbar' '--model' '/a b/it'\''s.gguf'");
        let args: Vec<String> = ["--port", "9", "--model=/m"].iter().map(|s| s.to_string()).collect();
        assert_eq!(flag_value(&args, "--model").as_deref(), Some("/m"));
        assert_eq!(flag_value(&args, "--port").as_deref(), Some("9"));
    }
}
