//! Publishing: persistent, `mandatory`, with the validated `user_id` and the message id, on a
//! confirm channel, through an outbox that keeps each envelope until the broker answers. A lost
//! confirm leaves it in the outbox, to be republished with the **same** id (the receiver dedupes).

use std::sync::Arc;

use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation, Connection};

use super::confirm_channel;
use super::envelope::{OutboxRecord, properties};
use crate::state::{StateError, StateStore};
use crate::wire::Sealed;

/// The broker's answer to one publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOutcome {
    /// Stored by the broker in the destination queue.
    Queued,
    /// No queue is bound for the routing key: "no such agent".
    NoRoute,
    /// The destination queue is full (`reject-publish`): back off and retry.
    InboxFull,
}

/// Why a send has no answer yet.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The outbox could not keep the envelope (nothing was published).
    #[error("cannot keep the message in the outbox")]
    Outbox(#[source] StateError),
    /// Published, but the confirm was lost; it stays in the outbox for republishing.
    #[error("the broker did not confirm the publish: {0}")]
    Unconfirmed(String),
}

/// A confirm channel in one vhost, publishing as one fleet user.
pub struct Publisher {
    channel: Channel,
    vhost: String,
    user: String,
    state: Arc<StateStore>,
}

impl Publisher {
    /// Opens a confirm channel on `connection` (to `vhost`) for fleet user `user`.
    pub async fn open(
        connection: &Connection,
        vhost: &str,
        user: &str,
        state: Arc<StateStore>,
    ) -> Result<Publisher, String> {
        let channel = confirm_channel(connection).await?;
        Ok(Publisher {
            channel,
            vhost: vhost.to_owned(),
            user: user.to_owned(),
            state,
        })
    }

    /// Publishes `sealed` to `exchange` with `key`, kept in the outbox until the broker answers.
    pub async fn send(
        &self,
        exchange: &str,
        key: &str,
        sealed: &Sealed,
    ) -> Result<SendOutcome, SendError> {
        let record = OutboxRecord::new(&self.vhost, exchange, key, sealed);
        let bytes =
            serde_json::to_vec(&record).map_err(|e| SendError::Unconfirmed(e.to_string()))?;
        self.state
            .outbox_put(sealed.meta.id, &bytes)
            .map_err(SendError::Outbox)?;
        self.publish(exchange, key, sealed).await
    }

    /// Republishes every outbox entry of this vhost with its original id; returns how many were
    /// answered (they leave the outbox) — the rest stay for the next attempt.
    pub async fn republish_pending(&self) -> Result<usize, SendError> {
        let mut answered = 0;
        for (_, bytes) in self.state.outbox_list().map_err(SendError::Outbox)? {
            let Ok(record) = serde_json::from_slice::<OutboxRecord>(&bytes) else {
                continue;
            };
            if record.vhost != self.vhost {
                continue;
            }
            if let Some(sealed) = record.sealed()
                && self
                    .publish(&record.exchange, &record.key, &sealed)
                    .await
                    .is_ok()
            {
                answered += 1;
            }
        }
        Ok(answered)
    }

    async fn publish(
        &self,
        exchange: &str,
        key: &str,
        sealed: &Sealed,
    ) -> Result<SendOutcome, SendError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..BasicPublishOptions::default()
        };
        let confirm = self
            .channel
            .basic_publish(
                exchange.into(),
                key.into(),
                options,
                &sealed.body,
                properties(sealed, &self.user),
            )
            .await
            .map_err(|e| SendError::Unconfirmed(e.to_string()))?;
        let answer = confirm
            .await
            .map_err(|e| SendError::Unconfirmed(e.to_string()))?;
        let outcome = match answer {
            // lapin pairs a return with whichever confirm completes next: match by message id.
            Confirmation::Ack(Some(returned))
                if returned
                    .delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .map(|id| id.as_str().to_owned())
                    == Some(sealed.meta.id.to_string()) =>
            {
                SendOutcome::NoRoute
            }
            Confirmation::Ack(_) => SendOutcome::Queued,
            Confirmation::Nack(_) => SendOutcome::InboxFull,
            Confirmation::NotRequested => {
                return Err(SendError::Unconfirmed("confirm mode is off".to_owned()));
            }
        };
        self.state
            .outbox_remove(sealed.meta.id)
            .map_err(SendError::Outbox)?;
        Ok(outcome)
    }
}
