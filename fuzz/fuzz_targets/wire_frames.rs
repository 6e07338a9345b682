//! Frames as a peer sends them, for every message of the client API and the agent protocol:
//! the first byte picks the message type, the rest is the stream read.
#![no_main]

use libfuzzer_sys::fuzz_target;
use quotient_common::agent_api::{AgentRequest, AgentResponse, LeaderRequest, LeaderResponse};
use quotient_common::api::{ApiRequest, ApiResponse};
use quotient_common::frame::{read_answer_frame, read_request_frame, MAX_FRAME_BYTES};

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
        match kind % 6 {
            0 => drop(read_request_frame::<ApiRequest>(reader, MAX_FRAME_BYTES).await),
            1 => drop(read_answer_frame::<ApiResponse>(reader, MAX_FRAME_BYTES).await),
            2 => drop(read_request_frame::<AgentRequest>(reader, MAX_FRAME_BYTES).await),
            3 => drop(read_answer_frame::<AgentResponse>(reader, MAX_FRAME_BYTES).await),
            4 => drop(read_request_frame::<LeaderRequest>(reader, MAX_FRAME_BYTES).await),
            _ => drop(read_answer_frame::<LeaderResponse>(reader, MAX_FRAME_BYTES).await),
        }
    });
});
