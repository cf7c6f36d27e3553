//! The host file: MLX's own format, as `mlx.distributed_config` writes it and `mlx.launch`
//! reads it: `{"backend": "ring", "envs": ["NAME=value", …], "hosts": [{"ssh": "host",
//! "ips": ["192.168.2.1", …], "rdma": [null, "rdma_en2", …]}, …]}` (one host entry per
//! rank), or the bare list of hosts as older versions wrote it.
//!
//! The backend is MLX's choice: `ring` (TCP, the default) or `jaccl` / `jaccl-ring`
//! (RDMA over Thunderbolt 5, macOS 26.2+). Each wants its own environment, which
//! [`Hostfile::backend_env`] prepares as `mlx.launch` does: the ring each rank's listening
//! addresses (`[["ip:port", …], …]`, ports counted up from a starting port per rank and IP);
//! jaccl each rank's RDMA devices and rank 0's address as its coordinator.
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// `mlx.launch`'s default starting port for the ring backend (and jaccl's coordinator).
pub const RING_PORT: u16 = 32323;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Host {
    /// Where `mlxbar cluster launch` starts this rank (`localhost` or this machine's name:
    /// here; anything else over ssh).
    pub ssh: String,
    /// Addresses the ring reaches this rank on (and mlxbar's doorbells, on any backend).
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// jaccl: this rank's RDMA device towards each rank (null towards itself); a device
    /// name or a list of them.
    #[serde(default)]
    pub rdma: Vec<serde_json::Value>,
}

/// MLX's distributed backend, as the host file's `backend` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// TCP sockets between neighbours (`ring`, or no backend named).
    Ring,
    /// RDMA over Thunderbolt 5, every rank cabled to every other (`jaccl`).
    Jaccl,
    /// RDMA over Thunderbolt 5 around a ring of cables (`jaccl-ring`).
    JacclRing,
}

impl Backend {
    /// The name `mlx_distributed_init` takes.
    pub fn mlx_name(self) -> &'static std::ffi::CStr {
        match self {
            Backend::Ring => c"ring",
            Backend::Jaccl | Backend::JacclRing => c"jaccl",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hostfile {
    pub hosts: Vec<Host>,
    pub backend: Backend,
    /// Environment variables every rank sets (the file's `envs`, e.g. MLX_METAL_FAST_SYNCH).
    pub envs: Vec<(String, String)>,
}

/// The two shapes MLX has written.
#[derive(Deserialize)]
#[serde(untagged)]
enum File {
    Full {
        #[serde(default)]
        backend: String,
        #[serde(default)]
        envs: Vec<String>,
        hosts: Vec<Host>,
    },
    Hosts(Vec<Host>),
}

impl Hostfile {
    pub fn read(path: &Path) -> Result<Hostfile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the host file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("host file {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Hostfile> {
        let file: File = serde_json::from_str(text).context(
            "expected MLX's host file format: {\"backend\": \"ring\", \"hosts\": [{\"ssh\": \"host\", \"ips\": [\"192.168.2.1\"]}, ...]}, one host entry per rank (or the bare list of hosts)",
        )?;
        let (backend, envs, hosts) = match file {
            File::Full { backend, envs, hosts } => (backend, envs, hosts),
            File::Hosts(hosts) => (String::new(), vec![], hosts),
        };
        let backend = match backend.as_str() {
            "" | "ring" => Backend::Ring,
            "jaccl" => Backend::Jaccl,
            "jaccl-ring" => Backend::JacclRing,
            other => bail!("backend {other:?}: mlxbar serves over MLX's ring and jaccl backends (\"ring\", \"jaccl\", \"jaccl-ring\")"),
        };
        let envs = envs.iter().map(|e| env_pair(e)).collect::<Result<_>>()?;
        if hosts.len() < 2 {
            bail!("{} rank(s): a cluster needs at least two (one process serves a model without one)", hosts.len());
        }
        // Every backend: mlxbar's doorbells beside MLX's links connect to each rank's first IP.
        if let Some((rank, h)) = hosts.iter().enumerate().find(|(_, h)| h.ips.is_empty()) {
            bail!("rank {rank} ({}) has no \"ips\": the ranks connect to IP addresses, not host names", h.ssh);
        }
        match backend {
            // MLX's ring connects each rank to its neighbours once per IP, as many each way.
            Backend::Ring => {
                if let Some((rank, h)) = hosts.iter().enumerate().find(|(_, h)| h.ips.len() != hosts[0].ips.len()) {
                    bail!(
                        "rank {rank} ({}) has {} IPs, rank 0 {}: the ring needs as many on every rank",
                        h.ssh,
                        h.ips.len(),
                        hosts[0].ips.len()
                    );
                }
            }
            // As mlx.distributed_config writes them: jaccl, a device towards every other rank;
            // jaccl-ring, towards the two neighbours (null towards the others); null towards
            // itself. jaccl's coordinator is rank 0's first IP, which it reads as IPv4.
            Backend::Jaccl | Backend::JacclRing => {
                let n = hosts.len();
                for (rank, h) in hosts.iter().enumerate() {
                    let device = |x: &serde_json::Value| x.as_str().is_some_and(|n| !n.is_empty());
                    let named = |d: &serde_json::Value| device(d) || d.as_array().is_some_and(|l| !l.is_empty() && l.iter().all(device));
                    let cabled = |to: usize| backend == Backend::Jaccl || to == (rank + 1) % n || to == (rank + n - 1) % n;
                    let ok = h.rdma.len() == n
                        && h.rdma.iter().enumerate().all(|(to, d)| match (to == rank, cabled(to)) {
                            (true, _) => d.is_null(),
                            (false, true) => named(d),
                            (false, false) => d.is_null() || named(d),
                        });
                    if !ok {
                        let towards = if backend == Backend::Jaccl { "each other rank" } else { "its two neighbours in the ring" };
                        bail!(
                            "rank {rank} ({}): jaccl needs \"rdma\" to list, for each of the {n} ranks, this rank's RDMA device towards {towards} and null towards itself (as mlx.distributed_config writes it)",
                            h.ssh
                        );
                    }
                }
                if !hosts[0].ips[0].is_ipv4() {
                    bail!("rank 0 ({}): jaccl's coordinator needs an IPv4 address first in \"ips\"", hosts[0].ssh);
                }
            }
        }
        Ok(Hostfile { hosts, backend, envs })
    }

    /// The environment MLX's backend reads for `rank`, with the files it names (name and
    /// contents, to be written user-only): the host file's `envs`, `MLX_RANK`, then the
    /// ring's `MLX_HOSTFILE` (its listening addresses from `port` up) or jaccl's
    /// `MLX_IBV_DEVICES` and `MLX_JACCL_COORDINATOR` (rank 0's first IP at `port`).
    pub fn backend_env(&self, rank: usize, port: u16) -> Result<BackendEnv> {
        // The file's envs first: what the backend needs to find the ranks is set after them.
        let mut vars = self.envs.clone();
        vars.push(("MLX_RANK".into(), rank.to_string()));
        let file = match self.backend {
            Backend::Ring => ("MLX_HOSTFILE".to_string(), format!("ring-{port}-rank{rank}.json"), self.ring(port)?),
            Backend::Jaccl | Backend::JacclRing => {
                let coordinator = SocketAddr::new(self.hosts[0].ips[0], port);
                vars.push(("MLX_JACCL_COORDINATOR".into(), coordinator.to_string()));
                if self.backend == Backend::JacclRing {
                    vars.push(("MLX_JACCL_RING".into(), "1".into()));
                }
                let devices: Vec<&Vec<serde_json::Value>> = self.hosts.iter().map(|h| &h.rdma).collect();
                ("MLX_IBV_DEVICES".to_string(), format!("jaccl-{port}-rank{rank}.json"), serde_json::to_string(&devices)?)
            }
        };
        Ok(BackendEnv { vars, file })
    }

    /// The ring backend's host file (`MLX_HOSTFILE`'s contents): each rank's IPs with ports
    /// from `port` up, one per rank and IP.
    fn ring(&self, port: u16) -> Result<String> {
        let mut next = port as u32;
        let mut ranks = Vec::with_capacity(self.hosts.len());
        for h in &self.hosts {
            let mut addrs = Vec::with_capacity(h.ips.len());
            for ip in &h.ips {
                if next > u16::MAX as u32 {
                    bail!("ring ports from {port} run past 65535");
                }
                addrs.push(SocketAddr::new(*ip, next as u16).to_string());
                next += 1;
            }
            ranks.push(addrs);
        }
        Ok(serde_json::to_string(&ranks)?)
    }
}

/// What a rank sets before MLX's backend starts: variables, and one file (the variable
/// naming it, the file's name, its contents) whose path becomes that variable's value.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendEnv {
    pub vars: Vec<(String, String)>,
    pub file: (String, String, String),
}

/// `NAME=value` from the host file's `envs`; the name as a shell would take it.
fn env_pair(e: &str) -> Result<(String, String)> {
    let (name, value) = e.split_once('=').with_context(|| format!("envs entry {e:?}: expected NAME=value"))?;
    let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid || value.contains('\0') {
        bail!("envs entry {e:?}: expected NAME=value with NAME of letters, digits and _");
    }
    // jaccl reads these before what mlxbar sets from the hosts (MLX_IBV_DEVICES, …).
    if name.starts_with("JACCL_") {
        bail!("envs entry {e:?}: mlxbar sets jaccl's place from the hosts (\"rdma\", \"ips\")");
    }
    Ok((name.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlx_host_files_parse_and_give_the_ring_its_addresses() {
        // As `mlx.distributed_config --backend ring` writes it for two Macs over a
        // Thunderbolt bridge, rdma included (jaccl's field).
        let text = r#"[{"ssh": "mac-a.local", "ips": ["10.0.0.1", "fd00::1"], "rdma": [null, "rdma_en2"]},
                       {"ssh": "mac-b.local", "ips": ["10.0.0.2", "fd00::2"]}]"#;
        let h = Hostfile::parse(text).unwrap();
        assert_eq!(h.hosts[1].ssh, "mac-b.local");
        assert_eq!(h.ring(RING_PORT).unwrap(), r#"[["10.0.0.1:32323","[fd00::1]:32324"],["10.0.0.2:32325","[fd00::2]:32326"]]"#);
    }

    #[test]
    fn the_backend_and_envs_of_mlx_distributed_config_are_kept() {
        // As `mlx.distributed_config --backend ring` writes it now (MLX 0.30 on).
        let ring = r#"{"backend": "ring", "envs": ["MLX_METAL_FAST_SYNCH=1"], "hosts": [
            {"ssh": "mac-a", "ips": ["10.0.0.1"], "rdma": []}, {"ssh": "mac-b", "ips": ["10.0.0.2"], "rdma": []}]}"#;
        let h = Hostfile::parse(ring).unwrap();
        assert_eq!(h.backend, Backend::Ring);
        let env = h.backend_env(1, RING_PORT).unwrap();
        assert_eq!(env.vars, [("MLX_METAL_FAST_SYNCH".into(), "1".into()), ("MLX_RANK".into(), "1".into())]);
        assert_eq!(env.file, ("MLX_HOSTFILE".into(), "ring-32323-rank1.json".into(), r#"[["10.0.0.1:32323"],["10.0.0.2:32324"]]"#.into()));

        // `--backend jaccl` for three Macs cabled to each other: rank 0's IP coordinates, and
        // the devices go to MLX_IBV_DEVICES as mlx.launch writes them.
        let jaccl = r#"{"backend": "jaccl", "envs": [], "hosts": [
            {"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en2", "rdma_en3"]},
            {"ssh": "b", "ips": ["10.0.0.2"], "rdma": ["rdma_en2", null, ["rdma_en3", "rdma_en4"]]},
            {"ssh": "c", "ips": ["10.0.0.3"], "rdma": ["rdma_en2", "rdma_en3", null]}]}"#;
        let h = Hostfile::parse(jaccl).unwrap();
        assert_eq!(h.backend.mlx_name(), c"jaccl");
        let env = h.backend_env(2, 40000).unwrap();
        assert_eq!(env.vars, [("MLX_RANK".into(), "2".into()), ("MLX_JACCL_COORDINATOR".into(), "10.0.0.1:40000".into())]);
        let devices = r#"[[null,"rdma_en2","rdma_en3"],["rdma_en2",null,["rdma_en3","rdma_en4"]],["rdma_en2","rdma_en3",null]]"#;
        assert_eq!(env.file, ("MLX_IBV_DEVICES".into(), "jaccl-40000-rank2.json".into(), devices.into()));
        let ring_of_cables = Hostfile::parse(&jaccl.replace(r#""jaccl""#, r#""jaccl-ring""#)).unwrap();
        assert!(ring_of_cables.backend_env(0, 40000).unwrap().vars.contains(&("MLX_JACCL_RING".into(), "1".into())));
        // `--backend jaccl-ring` for four Macs in a ring of cables: devices towards the
        // neighbours only; jaccl (every Mac cabled to every other) refuses the same file.
        let four = r#"{"backend": "jaccl-ring", "hosts": [
            {"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, "rdma_en2", null, "rdma_en3"]},
            {"ssh": "b", "ips": ["10.0.0.2"], "rdma": ["rdma_en3", null, "rdma_en2", null]},
            {"ssh": "c", "ips": ["10.0.0.3"], "rdma": [null, "rdma_en3", null, "rdma_en2"]},
            {"ssh": "d", "ips": ["10.0.0.4"], "rdma": ["rdma_en2", null, "rdma_en3", null]}]}"#;
        assert_eq!(Hostfile::parse(four).unwrap().backend, Backend::JacclRing);
        let e = format!("{:#}", Hostfile::parse(&four.replace("jaccl-ring", "jaccl")).unwrap_err());
        assert!(e.contains("rank 0 (a): jaccl needs") && e.contains("towards each other rank"), "{e}");
        let v6 = jaccl.replace("10.0.0.1", "fd00::1");
        assert!(format!("{:#}", Hostfile::parse(&v6).unwrap_err()).contains("needs an IPv4 address"));
    }

    #[test]
    fn bad_host_files_say_what_is_wrong() {
        let e = format!("{:#}", Hostfile::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}]"#).unwrap_err());
        assert!(e.contains("at least two"), "{e}");
        let e = format!("{:#}", Hostfile::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b"}]"#).unwrap_err());
        assert!(e.contains("rank 1 (b) has no \"ips\""), "{e}");
        let e = format!(
            "{:#}",
            Hostfile::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2", "10.0.1.2"]}]"#).unwrap_err()
        );
        assert!(e.contains("rank 1 (b) has 2 IPs, rank 0 1"), "{e}");
        let e = format!("{:#}", Hostfile::parse(r#"[{"ssh": "a", "ips": ["not-an-ip"]}, {"ssh": "b"}]"#).unwrap_err());
        assert!(e.contains("MLX's host file format"), "{e}");
        let e = format!("{:#}", Hostfile::parse(r#"{"hosts": []}"#).unwrap_err());
        assert!(e.contains("0 rank(s)"), "{e}");
        let two = r#""hosts": [{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]"#;
        let e = format!("{:#}", Hostfile::parse(&format!(r#"{{"backend": "mpi", {two}}}"#)).unwrap_err());
        assert!(e.contains("backend \"mpi\": mlxbar serves over MLX's ring and jaccl"), "{e}");
        let e = format!("{:#}", Hostfile::parse(&format!(r#"{{"envs": ["A B=1"], {two}}}"#)).unwrap_err());
        assert!(e.contains("envs entry \"A B=1\""), "{e}");
        let e = format!("{:#}", Hostfile::parse(&format!(r#"{{"envs": ["NOVALUE"], {two}}}"#)).unwrap_err());
        assert!(e.contains("expected NAME=value"), "{e}");
        let e = format!("{:#}", Hostfile::parse(&format!(r#"{{"envs": ["JACCL_RANK=3"], {two}}}"#)).unwrap_err());
        assert!(e.contains("mlxbar sets jaccl's place"), "{e}");
        let empty = r#"{"backend": "jaccl", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "rdma": [null, []]},
                                                     {"ssh": "b", "ips": ["10.0.0.2"], "rdma": ["rdma_en2", null]}]}"#;
        assert!(format!("{:#}", Hostfile::parse(empty).unwrap_err()).contains("rank 0 (a): jaccl needs"));
        // jaccl: a device towards every other rank, none towards itself.
        let e = format!("{:#}", Hostfile::parse(&format!(r#"{{"backend": "jaccl", {two}}}"#)).unwrap_err());
        assert!(e.contains("rank 0 (a): jaccl needs \"rdma\""), "{e}");
        let self_device = r#"{"backend": "jaccl", "hosts": [{"ssh": "a", "ips": ["10.0.0.1"], "rdma": ["rdma_en2", "rdma_en3"]},
                                                           {"ssh": "b", "ips": ["10.0.0.2"], "rdma": ["rdma_en2", null]}]}"#;
        assert!(format!("{:#}", Hostfile::parse(self_device).unwrap_err()).contains("rank 0 (a)"));
        let h = Hostfile::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]"#).unwrap();
        assert!(h.ring(65535).unwrap_err().to_string().contains("past 65535"));
    }
}
