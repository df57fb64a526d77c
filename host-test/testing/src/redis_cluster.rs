//! A Redis Cluster for tests: three masters with a replica each, on
//! loopback, started as this test process's own children (never
//! `--daemonize`, which would leave the session's scheduling group;
//! RELIABILITY.md) and joined by `redis-cli --cluster create`.
//!
//! The shared suites use one cluster per test process
//! ([`redis_cluster_url`]), or `REDIS_CLUSTER_URL` when set; tests that kill,
//! pause or reshard nodes start a private [`RedisCluster`].

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::redis_server::{dir_for, env_url, free_ports, until_listening};

/// How long a node may be unreachable before the cluster calls it failed
/// (and promotes its replica): short, so failover tests take seconds.
pub const NODE_TIMEOUT_MS: u64 = 1000;

/// One node of a test cluster.
pub struct ClusterNode {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Its cluster bus port. Chosen free like `port`, never Redis's default
    /// `port + 10000`: that may be taken, and for a port above 55535 it does
    /// not exist, so the node exits at start (CI once waited 10 s for a
    /// node on such a port and failed).
    bus_port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl ClusterNode {
    fn start(&mut self) -> Result<(), String> {
        let child = Command::new("redis-server")
            .current_dir(&self.dir)
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--cluster-port", &self.bus_port.to_string()])
            .args([
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
            ])
            .args(["--cluster-node-timeout", &NODE_TIMEOUT_MS.to_string()])
            // A replica that lost its master for a while still takes over:
            // the failover tests pause replicas on purpose.
            .args(["--cluster-replica-validity-factor", "0"])
            // A replica that comes back syncs at once, not after Redis's
            // default 5 s wait for more replicas to share the transfer.
            .args(["--repl-diskless-sync-delay", "0"])
            .args(["--save", "", "--appendonly", "no", "--dir", "."])
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        let child = self.child.insert(child);
        until_listening(self.port, || {
            child
                .try_wait()
                .ok()
                .flatten()
                .map(|status| format!("redis-server (cluster node) exited: {status}"))
        })
    }

    /// The process id, for signals.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether this node's process is running.
    pub fn running(&self) -> bool {
        self.child.is_some()
    }
}

/// A cluster this test started, killed (and its files removed) on drop.
pub struct RedisCluster {
    /// Every node, masters first as `--cluster create` was given them.
    pub nodes: Vec<ClusterNode>,
}

impl RedisCluster {
    /// Start `masters` masters with `replicas` replicas each and join them.
    pub fn spawn(masters: usize, replicas: usize) -> Result<Self, String> {
        let count = masters * (1 + replicas);
        let ports = free_ports(2 * count)?;
        let mut nodes = Vec::new();
        for pair in ports.chunks(2) {
            let (port, bus_port) = (pair[0], pair[1]);
            let mut node = ClusterNode {
                port,
                bus_port,
                dir: dir_for(port)?,
                child: None,
            };
            node.start()?;
            nodes.push(node);
        }
        let cluster = RedisCluster { nodes };
        let addresses: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        cluster.until_healthy(masters, Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// The URLs of every node, comma-separated: what `RedisConfig::url`
    /// takes for a cluster.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The node on `port`.
    pub fn node(&mut self, port: u16) -> &mut ClusterNode {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("a node of this cluster")
    }

    /// Wait until every running node reports `cluster_state:ok`, sees all
    /// 16384 slots served, and `masters` masters each have a replica
    /// whose link is up.
    pub fn until_healthy(&self, masters: usize, limit: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let healthy = self.nodes.iter().filter(|n| n.running()).all(|n| {
                cli(n.port, &["CLUSTER", "INFO"]).is_ok_and(|info| {
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
                })
            }) && self.replicated_masters() >= masters;
            if healthy {
                return Ok(());
            }
            if started.elapsed() > limit {
                let nodes = self
                    .nodes
                    .iter()
                    .find(|n| n.running())
                    .map(|n| cli(n.port, &["CLUSTER", "NODES"]).unwrap_or_default())
                    .unwrap_or_default();
                return Err(format!(
                    "the cluster did not become healthy in {limit:?}:\n{nodes}"
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Masters whose replica reports its link to them up.
    fn replicated_masters(&self) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.running())
            .filter(|n| {
                cli(n.port, &["INFO", "replication"]).is_ok_and(|info| {
                    info.contains("role:slave") && info.contains("master_link_status:up")
                })
            })
            .count()
    }

    /// The port of the master serving `slot`, from a running node's view.
    pub fn master_of(&self, slot: u16) -> Option<u16> {
        let node = self.nodes.iter().find(|n| n.running())?;
        let nodes = cli(node.port, &["CLUSTER", "NODES"]).ok()?;
        parse_nodes(&nodes)
            .into_iter()
            .find(|n| n.master && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|n| n.port)
    }

    /// The ports of the masters serving slots now.
    pub fn masters(&self) -> Vec<u16> {
        let Some(node) = self.nodes.iter().find(|n| n.running()) else {
            return Vec::new();
        };
        let nodes = cli(node.port, &["CLUSTER", "NODES"]).unwrap_or_default();
        parse_nodes(&nodes)
            .into_iter()
            .filter(|n| n.master && !n.slots.is_empty())
            .map(|n| n.port)
            .collect()
    }

    /// The port of a replica of the master on `port`.
    pub fn replica_of(&self, port: u16) -> Option<u16> {
        // The master itself knows its replicas at once; another node's
        // `CLUSTER NODES` learns of them by gossip, which lagged behind on a
        // busy machine (a test found no replica there and failed).
        for _ in 0..100 {
            if let Some(replica) = self.replica_as_seen(port) {
                return Some(replica);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }

    /// The replica `port`'s master reports online, else the one another
    /// node's view names.
    fn replica_as_seen(&self, port: u16) -> Option<u16> {
        if let Ok(info) = cli(port, &["INFO", "replication"]) {
            let online = info.lines().find_map(|line| {
                let fields = line.split_once(':')?.1;
                fields.contains("state=online").then(|| {
                    fields
                        .split(',')
                        .find_map(|f| f.strip_prefix("port=")?.parse().ok())
                })?
            });
            if online.is_some() {
                return online;
            }
        }
        let node = self.nodes.iter().find(|n| n.running() && n.port != port)?;
        let text = cli(node.port, &["CLUSTER", "NODES"]).ok()?;
        let nodes = parse_nodes(&text);
        let master = nodes.iter().find(|n| n.port == port)?;
        nodes
            .iter()
            .find(|n| n.master_id.as_deref() == Some(master.id.as_str()))
            .map(|n| n.port)
    }

    /// The node id of the node on `port`.
    pub fn id_of(&self, port: u16) -> Option<String> {
        cli(port, &["CLUSTER", "MYID"])
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// SIGKILL the node on `port`: it loses everything (it persists nothing).
    pub fn kill(&mut self, port: u16) {
        if let Some(mut child) = self.node(port).child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Send `signal` (`STOP`, `CONT`) to the node on `port`.
    pub fn signal(&mut self, port: u16, signal: &str) {
        if let Some(pid) = self.node(port).pid() {
            let _ = Command::new("kill")
                .args([format!("-{signal}"), pid.to_string()])
                .status();
        }
    }

    /// Start the node on `port` again, with its `nodes.conf`: it rejoins
    /// the cluster (as a replica, if it was failed over), empty.
    pub fn restart(&mut self, port: u16) -> Result<(), String> {
        self.node(port).start()
    }

    /// Move `slot` from the master on `from` to the master on `to` by hand, as
    /// `redis-cli --cluster reshard` does, but one key at a time with a pause
    /// after each: calls meanwhile meet a partition split between two nodes.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16, pause: Duration) {
        let (from_id, to_id) = (self.id_of(from).unwrap(), self.id_of(to).unwrap());
        let slot_text = slot.to_string();
        let ok = |port: u16, args: &[&str]| {
            let out = cli(port, args).unwrap();
            assert!(
                out.trim() == "OK" || out.trim() == "NOKEY",
                "{args:?} on {port}: {out}"
            );
        };
        ok(
            to,
            &["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &from_id],
        );
        ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &to_id],
        );
        loop {
            let keys = cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot_text, "10"]).unwrap();
            let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                break;
            }
            for key in keys {
                // No REPLACE: nothing of a partition is made on the target
                // before its keys arrive (a lock keeps no wake stream on a
                // cluster), so a key already there would be a bug.
                ok(
                    from,
                    &["MIGRATE", "127.0.0.1", &to.to_string(), key, "0", "5000"],
                );
                std::thread::sleep(pause);
            }
        }
        // The new owner first, then the old, then the rest (Redis's own order).
        let mut order = vec![to, from];
        order.extend(
            self.nodes
                .iter()
                .map(|n| n.port)
                .filter(|p| *p != to && *p != from),
        );
        for port in order {
            let _ = cli(port, &["CLUSTER", "SETSLOT", &slot_text, "NODE", &to_id]);
        }
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            let _ = std::fs::remove_dir_all(&node.dir);
        }
    }
}

/// One line of `CLUSTER NODES`.
pub struct NodeLine {
    /// The node's id.
    pub id: String,
    /// Its port.
    pub port: u16,
    /// Whether it is a master (and not failed).
    pub master: bool,
    /// Its master's id, for a replica.
    pub master_id: Option<String>,
    /// The slot ranges it serves.
    pub slots: Vec<(u16, u16)>,
}

/// Read `CLUSTER NODES` output.
pub fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
            let flags = *fields.get(2)?;
            let master = flags.contains("master") && !flags.contains("fail");
            let master_id = (fields.get(3) != Some(&"-")).then(|| fields[3].to_string());
            let slots = fields
                .iter()
                .skip(8)
                .filter(|f| !f.starts_with('['))
                .filter_map(|range| {
                    let mut ends = range.split('-');
                    let first: u16 = ends.next()?.parse().ok()?;
                    let last = ends.next().map_or(Some(first), |l| l.parse().ok())?;
                    Some((first, last))
                })
                .collect();
            Some(NodeLine {
                id: fields[0].to_string(),
                port,
                master,
                master_id,
                slots,
            })
        })
        .collect()
}

/// Run `redis-cli -p port args…` and return what it printed.
pub fn cli(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The cluster the shared suites run on: `REDIS_CLUSTER_URL` (comma-separated
/// node URLs) when set, else one cluster this test process starts on first
/// use, killed when the process exits.
pub fn redis_cluster_url() -> String {
    if let Some(url) = env_url("REDIS_CLUSTER_URL") {
        return url;
    }
    static SHARED: OnceLock<Result<String, String>> = OnceLock::new();
    match SHARED.get_or_init(spawn_for_this_process) {
        Ok(url) => url.clone(),
        Err(why) => panic!(
            "no Redis Cluster for the cluster suites: REDIS_CLUSTER_URL is unset and one \
             could not be started ({why}). Install redis-server and redis-tools."
        ),
    }
}

/// Start the cluster [`redis_cluster_url`] shares. A static is never
/// dropped, so its nodes are killed by a watcher: a shell whose standard
/// input is a pipe this process never closes, which reads end-of-file only
/// once the process is gone, then kills them.
fn spawn_for_this_process() -> Result<String, String> {
    let cluster = RedisCluster::spawn(3, 1)?;
    let url = cluster.url();
    let pids: Vec<String> = cluster
        .nodes
        .iter()
        .filter_map(|n| n.pid().map(|p| p.to_string()))
        .collect();
    let dirs: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("'{}'", n.dir.display()))
        .collect();
    let script = format!(
        "cat >/dev/null; kill {} 2>/dev/null; sleep 0.2; rm -rf {}",
        pids.join(" "),
        dirs.join(" ")
    );
    let mut watcher = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("sh: {e}"))?;
    std::mem::forget(watcher.stdin.take());
    // The watcher owns the nodes now.
    std::mem::forget(cluster);
    Ok(url)
}
