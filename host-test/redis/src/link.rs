//! What a store call travels on: one server's connection manager, or a
//! cluster connection that routes each command to the master serving its
//! key's slot; and, on a cluster, where each slot lives, for the
//! connections `wait-then-put` blocks on.
//!
//! The cluster connection (the `redis` crate's) follows `MOVED` and `ASK`,
//! retries `TRYAGAIN`, `CLUSTERDOWN` and lost connections with a backoff,
//! and re-reads the topology when it changes; every call stays bounded by
//! [`RedisConfig::response_timeout`], after which it is `unavailable`.

use ::redis::aio::{ConnectionLike, ConnectionManager};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use ::redis::{Cmd, ErrorKind, ProtocolVersion, RedisError, ServerErrorKind, Value};
use ::redis::{ConnectionAddr, ConnectionInfo, Pipeline, RedisFuture};

use super::RedisConfig;

/// The connection store calls are sent on (cheap to clone: a handle).
#[derive(Clone)]
pub(super) enum Link {
    /// One server, re-connected in the background when the connection drops.
    Single(ConnectionManager),
    /// A cluster: every command goes to the node serving its key's slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(conn) => conn.req_packed_command(cmd),
            Link::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single(conn) => conn.req_packed_commands(pipeline, offset, count),
            Link::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(conn) => conn.get_db(),
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}

impl Link {
    /// Send `cmd` to the node at `node` (`host:port`); on one server, to
    /// the server.
    pub(super) async fn to_node(&self, node: &Node, cmd: &Cmd) -> Result<Value, RedisError> {
        match (self, node) {
            (Link::Cluster(conn), Node::At(host, port)) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                });
                conn.clone().route_command(cmd.clone(), routing).await
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// Send `cmd` to the master serving `key`'s slot (to every master when
    /// no key is given); on one server, to the server.
    pub(super) async fn to_key_master(
        &self,
        key: Option<&[u8]>,
        cmd: &Cmd,
    ) -> Result<Value, RedisError> {
        match (self, key) {
            (Link::Cluster(conn), Some(key)) => {
                let route = Route::with_key(key, SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                conn.clone().route_command(cmd.clone(), routing).await
            }
            _ => cmd.query_async(&mut self.clone()).await,
        }
    }

    /// One `PING` to one server: on a cluster, to a master chosen at random
    /// (the cluster connection sends a plain `PING` to every node).
    pub(super) async fn ping(&self) -> Result<Value, RedisError> {
        let ping = ::redis::cmd("PING");
        match self {
            Link::Cluster(conn) => {
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary);
                conn.clone().route_command(ping, routing).await
            }
            Link::Single(_) => ping.query_async(&mut self.clone()).await,
        }
    }

    /// Subscribe to a partition's channel: `SSUBSCRIBE` on a cluster (the
    /// scripts `SPUBLISH` there, so a change is sent only by the node that
    /// serves the partition), `SUBSCRIBE` on one server.
    pub(super) async fn subscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Link::Single(conn) => conn.subscribe(channel).await,
            Link::Cluster(conn) => conn.ssubscribe(channel).await,
        }
    }

    /// Undo [`Link::subscribe`].
    pub(super) async fn unsubscribe(&mut self, channel: &str) -> Result<(), RedisError> {
        match self {
            Link::Single(conn) => conn.unsubscribe(channel).await,
            Link::Cluster(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// Connect to a cluster through `seeds` (any of its nodes; the rest are
/// found from them). `push` receives what the connection is sent outside
/// replies (notifications), if given; it then speaks RESP3.
pub(super) async fn cluster_connection(
    seeds: &[ConnectionInfo],
    config: &RedisConfig,
    push: Option<impl ::redis::aio::AsyncPushSender>,
) -> Result<ClusterConnection, RedisError> {
    let mut builder = ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(config.response_timeout)
        .response_timeout(config.response_timeout)
        // The whole call, redirections and retries included.
        .overall_response_timeout(Some(config.response_timeout))
        .retries(CLUSTER_RETRIES)
        // A flat wait, 10 to 50 ms at random, between attempts: the
        // deadline above, not a count of attempts, decides when to give up
        // (the crate's exponential formula would overflow past 60 retries).
        .retry_wait_formula(50, 1)
        .min_retry_wait(10)
        .max_retry_wait(50);
    if let Some(push) = push {
        builder = builder
            .use_protocol(ProtocolVersion::RESP3)
            .push_sender(push);
    }
    builder.build()?.get_async_connection().await
}

/// How often a cluster call may be sent again after a redirection, a
/// `TRYAGAIN` or `CLUSTERDOWN`, or a lost connection: enough that the
/// call's deadline ends it first. With 16, a call whose slot was moving
/// alternated `ASK` (retried at once) and `TRYAGAIN` (retried after a wait)
/// and ran out of attempts 0.16-1.6 s into its 2 s deadline (outside
/// testers: 23 of 1 178 adjusts answered 503 while a slot moved a key
/// every 700 ms).
const CLUSTER_RETRIES: u32 = 1_000;

/// Where a blocking connection goes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) enum Node {
    /// The one server of the single-server mode.
    Server,
    /// A cluster node, by host and port.
    At(String, u16),
}

/// Which cluster node serves which slots, as `CLUSTER SLOTS` last said.
#[derive(Default)]
pub(super) struct SlotTable {
    /// `(first slot, last slot, master)`, in the order Redis listed them.
    ranges: Vec<(u16, u16, Node)>,
}

impl SlotTable {
    /// Read the table from a `CLUSTER SLOTS` reply.
    pub(super) fn parse(reply: &Value) -> Option<SlotTable> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut table = SlotTable::default();
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                return None;
            };
            let (Some(host), Some(Value::Int(port))) = (master.first(), master.get(1)) else {
                return None;
            };
            let host = match host {
                Value::BulkString(host) => String::from_utf8(host.clone()).ok()?,
                Value::SimpleString(host) => host.clone(),
                _ => String::new(),
            };
            // A node that does not know its own address (NIL, "" or "?"):
            // its slots stay unknown, and their calls wait on the channel.
            if host.is_empty() || host == "?" {
                continue;
            }
            table.ranges.push((
                u16::try_from(*first).ok()?,
                u16::try_from(*last).ok()?,
                Node::At(host, u16::try_from(*port).ok()?),
            ));
        }
        Some(table)
    }

    /// The master serving `slot`, if the table knows one.
    pub(super) fn node(&self, slot: u16) -> Option<Node> {
        self.ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, node)| node.clone())
    }
}

/// The cluster slot of `key`: CRC16 of its hash tag (the part between the
/// first `{` and the next `}`, if not empty), else of the whole key, modulo
/// 16384, as Redis Cluster computes it.
pub fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % 16384
}

/// `seed` with its host and port replaced by `node`'s: the connection
/// settings (user, password, TLS) of the seed, for another node.
pub(super) fn info_for(seed: &ConnectionInfo, node: &Node) -> ConnectionInfo {
    let Node::At(host, port) = node else {
        return seed.clone();
    };
    let addr = match seed.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.clone(),
            port: *port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.clone(), *port),
    };
    seed.clone().set_addr(addr)
}

/// Whether `error` says the command reached a node that does not serve its
/// slot now, or a slot that is moving or unserved: the cluster's topology,
/// not the call, is the reason, and the call may be sent again.
pub(super) fn is_redirection(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        )
    )
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // The cluster spec's CRC16 check value, Redis's documented CLUSTER
        // KEYSLOT of "foo", and its hash tag example.
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("{user1000}.following"), slot_of("x{user1000}y"));
        // An empty tag is no tag: the whole key is hashed (CRC16 of "" is 0).
        assert_ne!(slot_of("{}foo"), slot_of("{}bar"));
    }
}
