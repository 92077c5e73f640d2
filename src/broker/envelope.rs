//! Sealed envelopes on the wire: metadata in AMQP properties and `fleetd-*` headers, the JSON body
//! as the message body. Also the outbox record that keeps an envelope until it is confirmed.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use uuid::Uuid;

use crate::wire::{Kind, Meta, Party, Sealed};

const H_VERSION: &str = "fleetd-v";
const H_ORIGIN_FLEET: &str = "fleetd-origin-fleet";
const H_ORIGIN_HOST: &str = "fleetd-origin-host";
const H_DEST_FLEET: &str = "fleetd-dest-fleet";
const H_DEST_HOST: &str = "fleetd-dest-host";
const H_KEY_ID: &str = "fleetd-key-id";
const H_CREATED: &str = "fleetd-created";
const H_EXPIRES: &str = "fleetd-expires";
const H_SIGNATURE: &str = "fleetd-sig";

/// The AMQP properties of `sealed` published by fleet user `user`: persistent, message id,
/// type, validated `user_id`, and the envelope metadata and signature as headers.
pub fn properties(sealed: &Sealed, user: &str) -> BasicProperties {
    let meta = &sealed.meta;
    let mut headers = FieldTable::default();
    let mut text = |name: &str, value: &str| {
        headers.insert(
            ShortString::from(name),
            AMQPValue::LongString(LongString::from(value)),
        );
    };
    text(H_ORIGIN_FLEET, &meta.origin.fleet);
    text(H_ORIGIN_HOST, &meta.origin.host);
    text(H_DEST_FLEET, &meta.dest.fleet);
    text(H_DEST_HOST, &meta.dest.host);
    text(H_KEY_ID, &meta.key_id);
    text(H_SIGNATURE, &STANDARD.encode(sealed.signature));
    headers.insert(
        ShortString::from(H_VERSION),
        AMQPValue::LongLongInt(i64::from(meta.version)),
    );
    headers.insert(
        ShortString::from(H_CREATED),
        AMQPValue::LongLongInt(meta.created_ms),
    );
    headers.insert(
        ShortString::from(H_EXPIRES),
        AMQPValue::LongLongInt(meta.expires_ms),
    );
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(meta.id.to_string()))
        .with_type(ShortString::from(meta.kind.as_str()))
        .with_user_id(ShortString::from(user))
        .with_app_id(ShortString::from("fleetd"))
        .with_timestamp(u64::try_from(meta.created_ms / 1000).unwrap_or(0))
        .with_headers(headers)
}

/// The longest fleet, host or key name an envelope header may carry.
pub const MAX_NAME: usize = 128;

/// Why a delivery's properties and headers do not form an envelope. Each names the field,
/// never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// No `message_id`, or not a UUID.
    #[error("missing or malformed message_id")]
    MessageId,
    /// No `type`, or not a kind fleetd sends.
    #[error("missing or unknown type")]
    Kind,
    /// No headers at all.
    #[error("no fleetd headers")]
    NoHeaders,
    /// A header is absent (or of another AMQP type).
    #[error("header `{0}` is missing")]
    Missing(&'static str),
    /// A text header is not UTF-8.
    #[error("header `{0}` is not UTF-8")]
    NotUtf8(&'static str),
    /// A fleet, host or key header is not a plain bounded name.
    #[error("header `{0}` is not a name (at most {MAX_NAME} of `A-Z a-z 0-9 . _ -`)")]
    NotAName(&'static str),
    /// The signature is not 64 bytes of base64.
    #[error("header `fleetd-sig` is malformed")]
    Signature,
    /// The version does not fit.
    #[error("header `fleetd-v` is out of range")]
    Version,
    /// A kind that does not belong on the queue it came from.
    #[error("`{0}` on the roster queue")]
    OffQueue(&'static str),
}

/// Reads an envelope back from a delivery's properties and body.
pub fn from_delivery(properties: &BasicProperties, body: &[u8]) -> Result<Sealed, EnvelopeError> {
    let id = properties
        .message_id()
        .as_ref()
        .and_then(|id| Uuid::parse_str(id.as_str()).ok())
        .ok_or(EnvelopeError::MessageId)?;
    let kind = properties
        .kind()
        .as_ref()
        .and_then(|k| Kind::parse(k.as_str()))
        .ok_or(EnvelopeError::Kind)?;
    let headers = properties
        .headers()
        .as_ref()
        .ok_or(EnvelopeError::NoHeaders)?;
    let text = |name: &'static str| -> Result<String, EnvelopeError> {
        match headers.inner().get(name) {
            Some(AMQPValue::LongString(s)) => {
                String::from_utf8(s.as_bytes().to_vec()).map_err(|_| EnvelopeError::NotUtf8(name))
            }
            _ => Err(EnvelopeError::Missing(name)),
        }
    };
    // Fleet, host and key names: bounded and plain before anything logs or checks them (a
    // refusal names them; a 100 KB or escape-laden header must not reach a log line).
    let name = |header: &'static str| -> Result<String, EnvelopeError> {
        let value = text(header)?;
        let plain = value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if value.len() > MAX_NAME || !plain {
            return Err(EnvelopeError::NotAName(header));
        }
        Ok(value)
    };
    let number = |name: &'static str| -> Result<i64, EnvelopeError> {
        match headers.inner().get(name) {
            Some(AMQPValue::LongLongInt(n)) => Ok(*n),
            _ => Err(EnvelopeError::Missing(name)),
        }
    };
    let signature: [u8; 64] = STANDARD
        .decode(text(H_SIGNATURE)?)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or(EnvelopeError::Signature)?;
    Ok(Sealed {
        meta: Meta {
            version: u32::try_from(number(H_VERSION)?).map_err(|_| EnvelopeError::Version)?,
            id,
            kind,
            origin: Party {
                fleet: name(H_ORIGIN_FLEET)?,
                host: name(H_ORIGIN_HOST)?,
            },
            dest: Party {
                fleet: name(H_DEST_FLEET)?,
                host: name(H_DEST_HOST)?,
            },
            key_id: name(H_KEY_ID)?,
            created_ms: number(H_CREATED)?,
            expires_ms: number(H_EXPIRES)?,
        },
        body: body.to_vec(),
        signature,
    })
}

/// An envelope waiting for its publisher confirm, with where it goes.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct OutboxRecord {
    /// The vhost it is published in.
    pub(super) vhost: String,
    /// The exchange.
    pub(super) exchange: String,
    /// The routing key.
    pub(super) key: String,
    /// The sender follows its delivery state (agent messages; not receipts or replies).
    #[serde(default)]
    pub(super) tracked: bool,
    meta: Meta,
    body: String,
    signature: String,
}

impl OutboxRecord {
    pub(super) fn new(vhost: &str, exchange: &str, key: &str, sealed: &Sealed) -> OutboxRecord {
        OutboxRecord {
            vhost: vhost.to_owned(),
            exchange: exchange.to_owned(),
            key: key.to_owned(),
            tracked: false,
            meta: sealed.meta.clone(),
            body: STANDARD.encode(&sealed.body),
            signature: STANDARD.encode(sealed.signature),
        }
    }

    pub(super) fn sealed(&self) -> Option<Sealed> {
        Some(Sealed {
            meta: self.meta.clone(),
            body: STANDARD.decode(&self.body).ok()?,
            signature: STANDARD.decode(&self.signature).ok()?.try_into().ok()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AgentMessage, HostKey, Payload, VERSION, seal};

    #[test]
    fn hostile_header_names_are_refused_without_echoing_them() {
        let key = HostKey::generate().unwrap().0;
        for hostile in [
            "h".repeat(100_000),
            "laptop\u{1b}[2J\nINFO fleetd: all good".to_owned(),
            "a b".to_owned(),
        ] {
            let meta = Meta {
                version: VERSION,
                id: Uuid::now_v7(),
                kind: Kind::AgentMessage,
                origin: Party {
                    fleet: "mac".to_owned(),
                    host: hostile.clone(),
                },
                dest: Party {
                    fleet: "fleet01".to_owned(),
                    host: String::new(),
                },
                key_id: String::new(),
                created_ms: 0,
                expires_ms: 1,
            };
            let payload = Payload::AgentMessage(AgentMessage {
                v: VERSION,
                to: Uuid::now_v7(),
                from: None,
                text: "x".to_owned(),
            });
            let sealed = seal(meta, &payload, &key);
            let refusal = match from_delivery(&properties(&sealed, "mac"), &sealed.body) {
                Err(refusal) => refusal,
                Ok(_) => panic!("a hostile host name was read back"),
            };
            assert_eq!(refusal, EnvelopeError::NotAName(H_ORIGIN_HOST), "{refusal}");
            // What a log line says of it: bounded, plain.
            let reason = refusal.to_string();
            assert!(reason.len() < 120, "bounded: {} bytes", reason.len());
            assert!(
                !reason.contains('\u{1b}') && !reason.contains('\n'),
                "{reason:?}"
            );
        }
    }
}
