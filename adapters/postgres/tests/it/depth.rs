//! `QueueDepth::depths` on `core.jobs`: every queue with rows and every queue asked for, in one
//! statement, with the same figures `depth` gives one queue.

use std::time::Duration;

use jobs_adapter_postgres::PgQueue;
use jobs_core::{PublishOptions, PullPort, QueueDepth, QueueName, QueuePort};
use jobs_testkit::fixtures;

use crate::db::with_databases;

fn name(s: &str) -> QueueName {
    s.parse().expect("valid")
}

#[tokio::test]
async fn depths_reads_every_queue_at_once_as_depth_reads_each() {
    with_databases(|dbs| async move {
        let pool = dbs.store().await.pool().clone();
        let queue = PgQueue::new(pool.clone());
        for (q, jobs, delayed) in [("depth.a", 3, 1), ("depth.b", 2, 0)] {
            for n in 0..jobs {
                let opts = if n < delayed {
                    PublishOptions::default().delay(Duration::from_secs(600))
                } else {
                    PublishOptions::default()
                };
                queue
                    .publish(&name(q), &fixtures::envelope(1, n), opts)
                    .await
                    .expect("publish");
            }
        }
        queue
            .receive(&name("depth.b"), 1, Duration::from_secs(30))
            .await
            .expect("lease one");
        let all = queue
            .depths(&[name("depth.quiet"), name("depth.a")])
            .await
            .expect("depths");
        let names: Vec<&str> = all.iter().map(|(q, _)| q.as_str()).collect();
        assert_eq!(names, ["depth.a", "depth.b", "depth.quiet"]);
        for (q, depth) in &all {
            assert_eq!(*depth, queue.depth(q).await.expect("depth"), "{q}");
        }
        assert_eq!(
            (
                all[0].1.ready,
                all[0].1.delayed,
                all[1].1.in_flight,
                all[2].1.total()
            ),
            (2, 1, 1, 0)
        );
    })
    .await;
}
