//! Frames between coordinators: Raft requests, envelopes (with log entries and snapshot
//! chunks) and responses.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quotient_common::frame::{read_answer_frame, read_request_frame, MAX_FRAME_BYTES};
use quotient_coordinator::network::{RaftEnvelope, RaftRequest, RaftResponse};

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, mut stream)) = data.split_first() else {
        return;
    };
    runtime().block_on(async move {
        let reader = &mut stream;
        match kind % 3 {
            0 => drop(read_request_frame::<RaftEnvelope>(reader, MAX_FRAME_BYTES).await),
            1 => drop(read_request_frame::<RaftRequest>(reader, MAX_FRAME_BYTES).await),
            _ => drop(read_answer_frame::<RaftResponse>(reader, MAX_FRAME_BYTES).await),
        }
    });
});
