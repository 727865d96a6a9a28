//! How a downstream module unit-tests what it publishes, with the port mocks and no transport.

use jobs_core::{Envelope, PublishOptions, QueueError, QueueName, QueuePort, Receipt, TenantId};
use jobs_testkit::fixtures;
use jobs_testkit::mock::MockQueuePort;
use serde_json::json;

/// The module under test: on sign-up, queue a welcome email on the transactional rail.
async fn on_signed_up(
    queue: &dyn QueuePort,
    tenant: TenantId,
    email: &str,
) -> Result<Receipt, QueueError> {
    let envelope = Envelope::new(
        tenant,
        fixtures::correlation(),
        fixtures::kind("accounts.welcome_email"),
        json!({ "to": email }),
    );
    let rail = "notif.email.transactional"
        .parse::<QueueName>()
        .expect("a valid name");
    queue
        .publish(&rail, &envelope, PublishOptions::default())
        .await
}

#[tokio::test]
async fn sign_up_publishes_one_welcome_email_on_the_transactional_rail() {
    let tenant = fixtures::tenant(7);
    let mut queue = MockQueuePort::new();
    queue
        .expect_publish()
        .withf(move |name, envelope, opts| {
            name.as_str() == "notif.email.transactional"
                && envelope.kind.as_str() == "accounts.welcome_email"
                && envelope.tenant_id == tenant
                && envelope.data == json!({ "to": "ada@example.test" })
                && opts.delay_value().is_none()
        })
        .times(1)
        .returning(|_, _, _| Ok(Receipt::queued(Some("m-1".into()))));

    let receipt = on_signed_up(&queue, tenant, "ada@example.test")
        .await
        .expect("published");
    assert_eq!(receipt.message_id.as_deref(), Some("m-1"));
}
