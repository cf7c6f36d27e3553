//! The host file: MLX's own format, as `mlx.distributed_config` writes it and `mlx.launch`
//! reads it: `[{"ssh": "host", "ips": ["192.168.2.1", …]}, …]`, one entry per rank. The
//! ring backend wants another: each rank's listening addresses (`[["ip:port", …], …]`),
//! ports counted up from a starting port per rank and IP, as `mlx.launch` counts them.
use std::net::IpAddr;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Deserialize;

/// `mlx.launch`'s default starting port for the ring backend.
pub const RING_PORT: u16 = 32323;

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Host {
    /// Where `mlxbar cluster launch` starts this rank (`localhost` or this machine's name:
    /// here; anything else over ssh).
    pub ssh: String,
    /// Addresses the ring reaches this rank on.
    #[serde(default)]
    pub ips: Vec<IpAddr>,
    /// jaccl's RDMA devices (Thunderbolt 5); read so a file written for jaccl parses.
    #[serde(default)]
    pub rdma: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Hostfile {
    pub hosts: Vec<Host>,
}

impl Hostfile {
    pub fn read(path: &Path) -> Result<Hostfile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading the host file {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("host file {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Hostfile> {
        let hosts: Vec<Host> = serde_json::from_str(text)
            .context("expected MLX's host file format: [{\"ssh\": \"host\", \"ips\": [\"192.168.2.1\"]}, ...], one entry per rank")?;
        if hosts.len() < 2 {
            bail!("{} rank(s): a cluster needs at least two (one process serves a model without one)", hosts.len());
        }
        if let Some((rank, h)) = hosts.iter().enumerate().find(|(_, h)| h.ips.is_empty()) {
            bail!("rank {rank} ({}) has no \"ips\": the ring backend connects to IP addresses, not host names", h.ssh);
        }
        // MLX's ring connects each rank to its neighbours once per IP, as many each way.
        if let Some((rank, h)) = hosts.iter().enumerate().find(|(_, h)| h.ips.len() != hosts[0].ips.len()) {
            bail!("rank {rank} ({}) has {} IPs, rank 0 {}: the ring needs as many on every rank", h.ssh, h.ips.len(), hosts[0].ips.len());
        }
        Ok(Hostfile { hosts })
    }

    /// The ring backend's host file (`MLX_HOSTFILE`'s contents): each rank's IPs with ports
    /// from `port` up, one per rank and IP.
    pub fn ring(&self, port: u16) -> Result<String> {
        let mut next = port as u32;
        let mut ranks = Vec::with_capacity(self.hosts.len());
        for h in &self.hosts {
            let mut addrs = Vec::with_capacity(h.ips.len());
            for ip in &h.ips {
                if next > u16::MAX as u32 {
                    bail!("ring ports from {port} run past 65535");
                }
                addrs.push(std::net::SocketAddr::new(*ip, next as u16).to_string());
                next += 1;
            }
            ranks.push(addrs);
        }
        Ok(serde_json::to_string(&ranks)?)
    }
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
        assert!(e.contains("MLX's host file format"), "{e}");
        let h = Hostfile::parse(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]"#).unwrap();
        assert!(h.ring(65535).unwrap_err().to_string().contains("past 65535"));
    }
}
