//! A three-node JetStream cluster on loopback for the tests that kill,
//! pause and restart its servers.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_nats::{NatsBackend, NatsConfig};

/// One server of the cluster.
pub struct Node {
    /// The server's name (`-n`).
    pub name: String,
    child: Option<Child>,
    /// The port it takes clients on.
    pub client_port: u16,
    binary: std::path::PathBuf,
    args: Vec<String>,
}

fn spawn(binary: &std::path::Path, args: &[String]) -> Child {
    Command::new(binary)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Three `nats-server`s routed to each other, killed on drop.
pub struct Cluster {
    /// The three servers.
    pub nodes: Vec<Node>,
    dir: std::path::PathBuf,
}

impl Cluster {
    /// Start the three servers, in a directory of the test `tag`'s own.
    pub fn start(tag: &str) -> Cluster {
        let binary = super::nats_server_binary().unwrap();
        let dir =
            std::env::temp_dir().join(format!("coord-nats-cluster-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ports = super::free_ports(6).unwrap();
        let (client_ports, route_ports) = ports.split_at(3);
        let routes = route_ports
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for i in 0..3 {
            let name = format!("n{i}");
            let args = vec![
                "-a".to_string(),
                "127.0.0.1".into(),
                "-p".into(),
                client_ports[i].to_string(),
                "-n".into(),
                name.clone(),
                "-js".into(),
                "-sd".into(),
                dir.join(&name).display().to_string(),
                "--cluster_name".into(),
                "coordtest".into(),
                "--cluster".into(),
                format!("nats://127.0.0.1:{}", route_ports[i]),
                "--routes".into(),
                routes.clone(),
            ];
            let child = spawn(&binary, &args);
            nodes.push(Node {
                name,
                child: Some(child),
                client_port: client_ports[i],
                binary: binary.clone(),
                args,
            });
        }
        Cluster { nodes, dir }
    }

    /// Every server's URL, comma-separated, as the backend takes a cluster.
    pub fn url(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The client port of the server called `name`.
    pub fn port_of(&self, name: &str) -> u16 {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap()
            .client_port
    }

    /// Send `signal` (`STOP`, `CONT`) to the server listening for clients on `port`.
    pub fn signal_by_port(&self, port: u16, signal: &str) -> String {
        let node = self.nodes.iter().find(|n| n.client_port == port).unwrap();
        let pid = node.child.as_ref().unwrap().id().to_string();
        let status = Command::new("kill")
            .args([format!("-{signal}"), pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} failed");
        node.name.clone()
    }

    /// Start a killed server again, with its data.
    pub fn restart(&mut self, name: &str) {
        let node = self.nodes.iter_mut().find(|n| n.name == name).unwrap();
        if node.child.is_none() {
            node.child = Some(spawn(&node.binary, &node.args));
        }
    }

    /// Kill node `name` (SIGKILL); [`NatsCluster::restart`] brings it back.
    pub fn kill(&mut self, name: &str) {
        let node = self.nodes.iter_mut().find(|n| n.name == name).unwrap();
        if let Some(mut child) = node.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The name of the server that leads `stream` now.
pub async fn stream_leader(client: &async_nats::Client, stream: &str) -> Option<String> {
    let reply = client
        .request(format!("$JS.API.STREAM.INFO.{stream}"), "".into())
        .await
        .ok()?;
    let info: serde_json::Value = serde_json::from_slice(&reply.payload).ok()?;
    info["cluster"]["leader"].as_str().map(str::to_string)
}

/// A backend on `cluster`'s stream `stream` at three replicas, once the
/// cluster has elected its JetStream meta leader and can make the stream.
pub async fn connect(cluster: &Cluster, stream: &str) -> Arc<NatsBackend> {
    connect_with_timeout(cluster, stream, Duration::from_secs(2)).await
}

/// [`connect`] with calls bounded at `response_timeout`.
pub async fn connect_with_timeout(
    cluster: &Cluster,
    stream: &str,
    response_timeout: Duration,
) -> Arc<NatsBackend> {
    let mut config = NatsConfig::new(&cluster.url());
    config.replicas = Some(3);
    config.stream = stream.into();
    config.response_timeout = response_timeout;
    let started = Instant::now();
    loop {
        match NatsBackend::connect(config.clone()).await {
            Ok(backend) => return Arc::new(backend),
            Err(e) if started.elapsed() < Duration::from_secs(60) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the cluster never took the stream: {e:?}"),
        }
    }
}
