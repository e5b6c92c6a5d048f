//! Retry decisions follow the error variant, also when the finalizer helper wrapped it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

mod support;

use std::sync::Arc;
use std::time::Duration;

use hpp_reconcile::Error;
use hpp_reconcile::operator::error_policy;
use kube::runtime::controller::Action;
use kube::runtime::finalizer;
use support::Env;

#[tokio::test]
async fn retry_follows_the_variant_not_its_text() {
    let env = Env::new("hostpathprovisioner_cr", &["node01"]);
    let hpp = Arc::new(env.hpp());
    let policy = |e: Error| error_policy(hpp.clone(), &e, env.ctx.clone());
    // Deletion waiting for cleanup Jobs polls at the base delay, wrapped or not.
    let quick = Action::requeue(Duration::from_millis(20));
    assert_eq!(policy(Error::CleanupPending("jobs".into())), quick);
    let wrapped: Error = finalizer::Error::CleanupFailed(Error::CleanupPending("jobs".into())).into();
    assert_eq!(policy(wrapped), quick);
    // A downgrade waits for a change, even inside the finalizer's ApplyFailed.
    let down = || Error::Downgrade {
        from: "v2".into(),
        to: "v1".into(),
    };
    assert_eq!(policy(down()), Action::await_change());
    assert_eq!(
        policy(finalizer::Error::ApplyFailed(down()).into()),
        Action::await_change()
    );
    // A spec error whose message merely mentions a category name is retried with backoff.
    assert_eq!(
        policy(Error::InvalidSpec("downgrade".into())),
        Action::requeue(Duration::from_millis(20))
    );
}
