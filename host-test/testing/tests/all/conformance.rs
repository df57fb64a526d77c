//! The store conformance suite (`coord_testing::conformance`) on every
//! backend coord ships, as a third-party backend would run it.

mod memory {
    async fn harness(history: usize) -> coord_testing::Harness {
        coord_testing::memory(history)
    }
    coord_testing::conformance_suite!(harness);
}

mod redis {
    coord_testing::conformance_suite!(coord_testing::redis);
}

mod redis_cluster {
    coord_testing::conformance_suite!(coord_testing::redis_cluster);
}

mod nats {
    coord_testing::conformance_suite!(coord_testing::nats);
}

mod postgres {
    coord_testing::conformance_suite!(coord_testing::postgres);
}

mod sqlite {
    coord_testing::conformance_suite!(coord_testing::sqlite);
}
