//! This process's control-group memory limit (Linux): a container's or a systemd unit's
//! `memory.limit_in_bytes` (cgroup v1) or `memory.max` (v2), which the kernel enforces with
//! its OOM killer long before /proc/meminfo's figures run out.
//!
//! The group comes from /proc/self/cgroup (v1: the line whose controllers include
//! `memory`; v2: the `0::` line), its directory from /proc/self/mountinfo (the cgroup mount
//! whose root holds that path), as runc and cAdvisor find them. Every level from that group
//! up to the mount counts (a parent's limit binds its children too): the one with the least
//! headroom is reported. Usage includes page cache the kernel can drop, so the working set
//! is usage less inactive file pages (`total_inactive_file` in v1's memory.stat,
//! `inactive_file` in v2's), as docker stats and cAdvisor compute it.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::CgroupLimit;

/// Where this process's memory group lives in the cgroup tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnGroup {
    pub version: u8,
    /// The group's path as /proc/self/cgroup gives it (from the hierarchy's root).
    pub path: String,
}

/// This process's memory group, from /proc/self/cgroup's text. A v1 `memory` controller
/// wins over the v2 line: on hybrid systems the memory controller sits on v1 and the
/// unified hierarchy has no `memory.max`.
pub fn own_group(proc_self_cgroup: &str) -> Vec<OwnGroup> {
    let mut v1 = None;
    let mut v2 = None;
    for line in proc_self_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        if id == "0" && controllers.is_empty() {
            v2 = Some(OwnGroup { version: 2, path: path.to_string() });
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(OwnGroup { version: 1, path: path.to_string() });
        }
    }
    v1.into_iter().chain(v2).collect()
}

/// A cgroup mount: the root of the hierarchy it shows and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub root: String,
    pub mount_point: PathBuf,
}

/// The mount of the memory hierarchy of `version` in /proc/self/mountinfo's text: fstype
/// `cgroup` with the `memory` super option (v1), or `cgroup2` (v2).
pub fn mount(mountinfo: &str, version: u8) -> Option<Mount> {
    mountinfo.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (root, mount_point) = (*left.get(3)?, *left.get(4)?);
        let fstype = *right.first()?;
        let wanted = match version {
            1 => fstype == "cgroup" && right.get(2).is_some_and(|o| o.split(',').any(|o| o == "memory")),
            _ => fstype == "cgroup2",
        };
        wanted.then(|| Mount { root: unescape(root), mount_point: PathBuf::from(unescape(mount_point)) })
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The group's directory, and every parent up to the mount point, innermost first. The
/// group's path is relative to the hierarchy's root; the mount shows the hierarchy from
/// `mount.root` (a container sees its own group as `/`). A path outside the mount's root
/// (a cgroup namespace showing `/..`) falls back to the mount point alone.
pub fn levels(mount: &Mount, group_path: &str) -> Vec<PathBuf> {
    let root = Path::new(&mount.root);
    let rel = match Path::new(group_path).strip_prefix(root) {
        Ok(rel) if !group_path.contains("/..") => rel.to_path_buf(),
        _ => PathBuf::new(),
    };
    let mut dir = mount.mount_point.join(rel);
    let mut out = vec![dir.clone()];
    while dir != mount.mount_point && dir.pop() {
        out.push(dir.clone());
    }
    out
}

/// A limit file's value: bytes, or None for v2's `max`.
pub fn parse_limit(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// A key's value in a memory.stat (`key value` lines).
pub fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.split_once(' ').filter(|(k, _)| *k == key).and_then(|(_, v)| v.trim().parse().ok()))
}

/// Usage less the inactive file pages the kernel reclaims before it OOM-kills.
pub fn working_set(version: u8, usage: u64, stat: &str) -> u64 {
    let inactive = if version == 1 { stat_value(stat, "total_inactive_file") } else { stat_value(stat, "inactive_file") };
    usage.saturating_sub(inactive.unwrap_or(0))
}

/// One level's limit and working set; None when it sets no limit or cannot be read.
fn read_level(version: u8, dir: &Path) -> Option<CgroupLimit> {
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let (limit_file, usage_file) =
        if version == 1 { ("memory.limit_in_bytes", "memory.usage_in_bytes") } else { ("memory.max", "memory.current") };
    let limit = parse_limit(&read(limit_file)?)?;
    let usage = parse_limit(&read(usage_file)?)?;
    let stat = read("memory.stat").unwrap_or_default();
    Some(CgroupLimit { version, path: dir.display().to_string(), limit, working_set: working_set(version, usage, &stat) })
}

/// The level with the least headroom, if any sets a limit below `u64::MAX`.
pub fn tightest(levels: impl IntoIterator<Item = CgroupLimit>) -> Option<CgroupLimit> {
    levels.into_iter().min_by_key(CgroupLimit::headroom)
}

/// The directories to read, found once: a process does not change groups under us.
fn own_levels() -> &'static Option<(u8, Vec<PathBuf>)> {
    static LEVELS: OnceLock<Option<(u8, Vec<PathBuf>)>> = OnceLock::new();
    LEVELS.get_or_init(|| {
        let groups = own_group(&std::fs::read_to_string("/proc/self/cgroup").ok()?);
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        groups.iter().find_map(|g| Some((g.version, levels(&mount(&mountinfo, g.version)?, &g.path))))
    })
}

/// This process's binding cgroup memory limit now; None without a cgroup memory
/// controller or a limit.
pub fn read() -> Option<CgroupLimit> {
    let (version, dirs) = own_levels().as_ref()?;
    tightest(dirs.iter().filter_map(|d| read_level(*version, d)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This project's build machine (2026-12-02): cgroup v1 controllers plus an empty
    /// unified hierarchy; the memory controller puts the process in a group of its own.
    const MACHINE_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n7:blkio:/\n6:freezer:/\n5:devices:/\n4:memory:/process_api/d09804db32aa2e04baee188f039acb46\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";
    const MACHINE_MOUNTINFO: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A systemd machine on cgroup v2 only (Debian 12, a user session's terminal scope):
    /// one `0::` line and one cgroup2 mount with its optional `shared:` field.
    const V2_CGROUP: &str =
        "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice/vte-spawn-5d3f.scope\n";
    const V2_MOUNTINFO: &str = "22 28 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
25 28 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
28 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
";

    #[test]
    fn this_machine_is_v1_memory_beside_an_empty_unified_hierarchy() {
        let groups = own_group(MACHINE_CGROUP);
        assert_eq!(groups[0], OwnGroup { version: 1, path: "/process_api/d09804db32aa2e04baee188f039acb46".into() });
        assert_eq!(groups[1], OwnGroup { version: 2, path: "/".into() });
        let m = mount(MACHINE_MOUNTINFO, 1).unwrap();
        assert_eq!(m, Mount { root: "/".into(), mount_point: "/sys/fs/cgroup/memory".into() });
        let dirs = levels(&m, &groups[0].path);
        let want = [
            "/sys/fs/cgroup/memory/process_api/d09804db32aa2e04baee188f039acb46",
            "/sys/fs/cgroup/memory/process_api",
            "/sys/fs/cgroup/memory",
        ];
        assert_eq!(dirs, want.map(PathBuf::from));
        // The cpu controller's mount is not the memory one.
        assert_eq!(mount(MACHINE_MOUNTINFO, 2).unwrap().mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn v2_is_the_zero_line_and_the_cgroup2_mount() {
        let groups = own_group(V2_CGROUP);
        assert_eq!(groups.len(), 1);
        assert_eq!(groups[0].version, 2);
        let m = mount(V2_MOUNTINFO, 2).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(mount(V2_MOUNTINFO, 1), None);
        let dirs = levels(&m, &groups[0].path);
        assert_eq!(dirs.len(), 7);
        assert_eq!(
            dirs[0],
            PathBuf::from(
                "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice/vte-spawn-5d3f.scope"
            )
        );
        assert_eq!(dirs.last().unwrap(), &PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn a_container_sees_its_group_at_the_mount_point() {
        // docker on v1 without a cgroup namespace: the mount's root is the container's group.
        let info =
            "1012 1005 0:33 /docker/4f1e /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime master:15 - cgroup cgroup rw,memory\n";
        let m = mount(info, 1).unwrap();
        assert_eq!(levels(&m, "/docker/4f1e"), vec![PathBuf::from("/sys/fs/cgroup/memory")]);
        // With a namespace (v2): `0::/` and a mount of `/`; a path outside it falls back.
        let m = Mount { root: "/".into(), mount_point: "/sys/fs/cgroup".into() };
        assert_eq!(levels(&m, "/"), vec![PathBuf::from("/sys/fs/cgroup")]);
        assert_eq!(levels(&m, "/../../system.slice"), vec![PathBuf::from("/sys/fs/cgroup")]);
    }

    #[test]
    fn mount_points_with_escaped_spaces() {
        let info = "40 31 0:37 / /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n";
        assert_eq!(mount(info, 2).unwrap().mount_point, PathBuf::from("/mnt/my cgroups"));
    }

    #[test]
    fn limits_and_the_working_set() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("419430400\n"), Some(400 << 20));
        // This machine's memory.stat (v1): the page cache's inactive part is not charged
        // as working set; v2 names the same counter without `total_`.
        let v1 = "cache 410079232\nrss 1806336\ninactive_file 200916992\nhierarchical_memory_limit 9223372036854771712\ntotal_inactive_file 200916992\n";
        assert_eq!(working_set(1, 438_927_360, v1), 438_927_360 - 200_916_992);
        assert_eq!(working_set(2, 1000, "anon 10\ninactive_file 300\n"), 700);
        assert_eq!(working_set(2, 100, "inactive_file 300\n"), 0);
        let level = |limit: u64, ws: u64| CgroupLimit { version: 1, path: format!("{limit}"), limit, working_set: ws };
        // The parent's 1 GiB with 900 MiB charged binds before the child's 2 GiB.
        let t = tightest([level(2 << 30, 100 << 20), level(1 << 30, 900 << 20), level(u64::MAX, 0)]).unwrap();
        assert_eq!(t.limit, 1 << 30);
        assert_eq!(tightest([]), None);
    }
}
