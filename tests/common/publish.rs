//! A test publisher: one envelope at a time, persistent, `mandatory`, with the given `user_id`
//! and the message id, on a confirm channel, kept in an outbox until the broker answers — what
//! an attacker holding a fleet's credential can do by hand (the daemon publishes through
//! `broker::deliver`'s pump). It lets the tests send crafted envelopes.

use std::sync::Arc;

use lapin::options::BasicPublishOptions;
use lapin::{Channel, Confirmation, Connection};

use fleetd::broker::confirm_channel;
use fleetd::broker::envelope::properties;
use fleetd::state::{StateError, StateStore};
use fleetd::wire::Sealed;

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
        let channel = confirm_channel(connection)
            .await
            .map_err(|e| e.to_string())?;
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
        // The outbox entry is the envelope's bytes: this publisher only needs to know what the
        // broker has not answered yet.
        self.state
            .outbox_put(sealed.meta.id, &sealed.body)
            .map_err(SendError::Outbox)?;
        self.publish(exchange, key, sealed).await
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
