//! The shortened names of rendered objects are the values they were before the hash moved to
//! `hpp_api::names`: live clusters hold objects by these names.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers may fail loudly

use hpp_reconcile::names::{cleanup_job_name, name_with_max_length, pool_node_name, pool_shared_claim_name};

const LONG_POOL: &str = "a-very-long-storage-pool-name-for-testing-purposes";

#[test]
fn shortened_object_names_are_unchanged() {
    assert_eq!(
        pool_node_name(LONG_POOL, "node-1"),
        "hpp-pool-a-very-long-storage-pool-name-for-test-572eaa0a-node-1"
    );
    assert_eq!(
        pool_shared_claim_name(LONG_POOL),
        "hpp-pool-a-very-long-storage-pool-name-for-test-572eaa0a-shared"
    );
    let long_node = "worker-node-with-a-really-long-name-in-the-cluster-zone-a-001";
    assert_eq!(pool_node_name("local", long_node), "hpp-pool-local-373e2884");
    assert_eq!(
        cleanup_job_name("local", &"n".repeat(60)),
        "cleanup-pool-local-70521aa9"
    );
    // Short names are not hashed at all.
    assert_eq!(pool_node_name("local", "node-1"), "hpp-pool-local-node-1");
    assert_eq!(name_with_max_length("a", "b", 63), "a-b");
}
