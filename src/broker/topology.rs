//! Names and arguments of the fleet topology (DESIGN.md "Broker topology"), one place.

use lapin::options::{
    ExchangeBindOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Channel, ExchangeKind};

use super::AmqpError;

/// Topic exchange every host of the fleet publishes into: key `ctl.HOST` for a gateway's
/// control queue, `agent.HOST.ID` for an agent's inbox. No host may read it (so none may bind a
/// queue to it); the admin binds it to each host's own exchange (no alternate exchange:
/// `mandatory` must see a missing inbox or host).
pub const SEND_EXCHANGE: &str = "fleet.send";
/// Topic exchange for presence beats.
pub const ROSTER_EXCHANGE: &str = "roster";

/// Host `host`'s own exchange, bound by the admin from [`SEND_EXCHANGE`] with
/// [`host_binding_keys`]: only that host may read it, so only it can bind a queue there, and
/// what is addressed to another host never reaches a queue it could bind.
pub fn host_exchange(host: &str) -> String {
    format!("host.{host}")
}

/// The keys [`SEND_EXCHANGE`] is bound to [`host_exchange`] with: the host's control key and
/// its agents' keys. A topic `*` is exactly one word and an agent id has no dot, so
/// `agent.H.*` matches no other host's keys, even when host names contain dots.
pub fn host_binding_keys(host: &str) -> [String; 2] {
    [control_key(host), format!("agent.{host}.*")]
}

/// The routing key of host `host`'s control queue, in its own fleet and in an ingress exchange.
pub fn control_key(host: &str) -> String {
    format!("ctl.{host}")
}

/// The routing key of agent `id`'s inbox on host `host`.
pub fn agent_key(host: &str, id: &str) -> String {
    format!("agent.{host}.{id}")
}

/// The keys an ingress exchange `x.in.O` is bound to the fleet's exchanges with, by the admin:
/// control messages into [`SEND_EXCHANGE`], beats into [`ROSTER_EXCHANGE`]. Nothing else an
/// origin publishes is routed.
pub const INGRESS_BINDINGS: [(&str, &str); 2] =
    [(SEND_EXCHANGE, "ctl.#"), (ROSTER_EXCHANGE, "roster.#")];

/// Longest queue an inbox or control queue may grow to before publishes are refused.
pub const DEFAULT_MAX_LENGTH: i64 = 10_000;

/// The ingress exchange in a fleet's vhost for messages from fleet `origin`.
pub fn ingress_exchange(origin: &str) -> String {
    format!("x.in.{origin}")
}

/// The durable inbox of agent `id` of host `host`: the host in the name lets a host user's
/// permissions name its own inboxes (`agent.HOST.*`) and no other host's.
pub fn inbox_queue(host: &str, id: &str) -> String {
    format!("agent.{host}.{id}.inbox")
}

/// Host `host`'s control queue (bound with [`control_key`]).
pub fn control_queue(host: &str) -> String {
    format!("gw.{host}.ctl")
}

/// The queue a message published with routing key `key` (into [`SEND_EXCHANGE`], or into an
/// ingress exchange, which routes `ctl.#` only) ends in: `ctl.HOST` → the host's control queue,
/// `agent.HOST.ID` → that agent's inbox; `None` for any other key.
pub fn queue_of_key(key: &str) -> Option<String> {
    if let Some(host) = key.strip_prefix("ctl.") {
        return (!host.is_empty()).then(|| control_queue(host));
    }
    let (host, id) = key.strip_prefix("agent.")?.rsplit_once('.')?;
    (!host.is_empty() && !id.is_empty()).then(|| inbox_queue(host, id))
}

/// Queue type, by config: classic (single node, LavinMQ) or quorum (RabbitMQ cluster).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueType {
    /// Classic queues.
    Classic,
    /// Quorum queues (replicated).
    Quorum,
}

/// Arguments of inbox and control queues: single active consumer, bounded length with
/// `reject-publish` (back-pressure as a nack, never a silent drop), no TTL, no dead-lettering.
pub fn inbox_arguments(queue_type: QueueType, max_length: i64) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        ShortString::from("x-single-active-consumer"),
        AMQPValue::Boolean(true),
    );
    args.insert(
        ShortString::from("x-max-length"),
        AMQPValue::LongLongInt(max_length),
    );
    args.insert(
        ShortString::from("x-overflow"),
        AMQPValue::LongString(LongString::from("reject-publish")),
    );
    let kind = match queue_type {
        QueueType::Classic => "classic",
        QueueType::Quorum => "quorum",
    };
    args.insert(
        ShortString::from("x-queue-type"),
        AMQPValue::LongString(LongString::from(kind)),
    );
    args
}

/// Makes sure the fleet's exchanges and host `host`'s own exchange exist and returns a channel
/// to go on with. They are the admin's (`fleetd broker grants --fleet F --host H --apply`
/// declares them and binds `fleet.send` to `host.H`), so they are first looked up passively — a
/// host user may neither configure them nor bind between them; only when one is missing are
/// they declared and bound, which only a shared fleet user may do.
pub async fn ensure_exchanges(
    connection: &lapin::Connection,
    host: &str,
) -> Result<Channel, AmqpError> {
    let open = || async {
        connection
            .create_channel()
            .await
            .map_err(AmqpError::failed("open a channel"))
    };
    let channel = open().await?;
    if declare_with(&channel, host, true).await.is_ok() {
        return Ok(channel);
    }
    // The failed lookup closed that channel.
    let channel = open().await?;
    declare_with(&channel, host, false).await.map_err(|e| {
        if e.is("ACCESS_REFUSED") {
            AmqpError::Undeclared {
                host: host.to_owned(),
                source: Box::new(e),
            }
        } else {
            e
        }
    })?;
    Ok(channel)
}

/// Declares the fleet's exchanges and host `host`'s, bound (idempotent; a shared fleet user's
/// or the admin's right).
pub async fn declare_exchanges(channel: &Channel, host: &str) -> Result<(), AmqpError> {
    declare_with(channel, host, false).await
}

/// Declares (or, `passive`, looks up) the fleet's two exchanges and `host.HOST`; declaring also
/// binds `fleet.send` to `host.HOST`.
async fn declare_with(channel: &Channel, host: &str, passive: bool) -> Result<(), AmqpError> {
    let durable = ExchangeDeclareOptions {
        durable: true,
        passive,
        ..ExchangeDeclareOptions::default()
    };
    let own = host_exchange(host);
    for name in [SEND_EXCHANGE, ROSTER_EXCHANGE, own.as_str()] {
        channel
            .exchange_declare(
                name.into(),
                ExchangeKind::Topic,
                durable,
                FieldTable::default(),
            )
            .await
            .map_err(AmqpError::failed(format!("declare exchange `{name}`")))?;
    }
    if !passive {
        for key in host_binding_keys(host) {
            channel
                .exchange_bind(
                    own.as_str().into(),
                    SEND_EXCHANGE.into(),
                    key.as_str().into(),
                    ExchangeBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(AmqpError::failed(format!(
                    "bind `{own}` to `{SEND_EXCHANGE}` with `{key}`"
                )))?;
        }
    }
    Ok(())
}

/// Declares a durable inbox-style queue (see [`inbox_arguments`]) and binds it from `exchange`
/// with `key` (idempotent).
pub async fn declare_bound_queue(
    channel: &Channel,
    queue: &str,
    exchange: &str,
    key: &str,
    arguments: FieldTable,
) -> Result<(), AmqpError> {
    let options = QueueDeclareOptions {
        durable: true,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), options, arguments)
        .await
        .map_err(AmqpError::failed(format!("declare queue `{queue}`")))?;
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(AmqpError::failed(format!("bind `{queue}`")))
}

/// Arguments of a roster queue: presence is soft state, so the queue expires when its gateway is
/// gone for two minutes, beats older than 15 s are dropped, and the length is bounded. With
/// quorum queues the roster queue is quorum too (durable, replicated): a classic queue lives on
/// one node, and losing that node would cancel its consumer and bounce the link of a host
/// connected elsewhere. (RabbitMQ ≥ 3.10 honours `x-message-ttl` on quorum queues.)
pub fn roster_arguments(queue_type: QueueType) -> FieldTable {
    let mut args = FieldTable::default();
    if queue_type == QueueType::Quorum {
        args.insert(
            ShortString::from("x-queue-type"),
            AMQPValue::LongString(LongString::from("quorum")),
        );
    }
    args.insert(
        ShortString::from("x-expires"),
        AMQPValue::LongLongInt(120_000),
    );
    args.insert(
        ShortString::from("x-message-ttl"),
        AMQPValue::LongLongInt(15_000),
    );
    args.insert(
        ShortString::from("x-max-length"),
        AMQPValue::LongLongInt(DEFAULT_MAX_LENGTH),
    );
    args
}

/// Declares this host's named (never server-named) roster queue (see [`roster_arguments`];
/// durable when quorum, as quorum queues must be) and binds it from each `(exchange, key)`.
pub async fn declare_roster_queue(
    channel: &Channel,
    queue: &str,
    queue_type: QueueType,
    bindings: &[(String, String)],
) -> Result<(), AmqpError> {
    let options = QueueDeclareOptions {
        durable: queue_type == QueueType::Quorum,
        ..QueueDeclareOptions::default()
    };
    channel
        .queue_declare(queue.into(), options, roster_arguments(queue_type))
        .await
        .map_err(AmqpError::failed(format!("declare queue `{queue}`")))?;
    for (exchange, key) in bindings {
        channel
            .queue_bind(
                queue.into(),
                exchange.as_str().into(),
                key.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(AmqpError::failed(format!("bind `{queue}` to `{exchange}`")))?;
    }
    Ok(())
}
