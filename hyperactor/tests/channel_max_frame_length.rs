//! `HYPERACTOR_CODEC_MAX_FRAME_LENGTH` sets the maximum frame length of the
//! process, on the sending and the receiving side.
//!
//! One test only: the variable is read once per process, so this binary sets
//! it before any frame is sent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use bytes::Bytes;
use hyperactor::channel::{
    dial, max_frame_len, serve, ChannelAddr, ChannelError, ChannelTransport, Frame, FrameError,
    MAX_FRAME_LEN_ENV,
};
use hyperactor::testing::timed;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const MAX: u64 = 4096;

#[tokio::test]
async fn the_environment_sets_the_maximum_frame_length() {
    // The only test of this binary, and it runs before anything reads the variable.
    std::env::set_var(MAX_FRAME_LEN_ENV, MAX.to_string());
    assert_eq!(max_frame_len(), MAX);

    let mut rx = serve(&ChannelAddr::any(ChannelTransport::Unix))
        .await
        .unwrap();
    let tx = dial(rx.addr(), Arc::new(|_, _| {}));
    // Sending: a frame over the maximum is handed back; one at it goes through.
    let over = Frame::new(
        Bytes::from_static(b"h"),
        vec![Bytes::from(vec![0u8; MAX as usize])],
    );
    let err = timed(tx.send(over)).await.unwrap_err();
    assert!(
        matches!(
            err.error,
            ChannelError::Frame {
                source: FrameError::TooLarge {
                    len: 4097,
                    max: MAX
                },
                ..
            }
        ),
        "{err}"
    );
    let at = Frame::new(
        Bytes::from_static(b"h"),
        vec![Bytes::from(vec![0u8; MAX as usize - 1])],
    );
    timed(tx.send(at.clone())).await.unwrap();
    assert_eq!(timed(rx.recv()).await.unwrap(), at);

    // Receiving: a peer that claims a longer frame is disconnected at once.
    let ChannelAddr::Unix(path) = rx.addr().clone() else {
        unreachable!()
    };
    let mut raw = tokio::net::UnixStream::connect(&path).await.unwrap();
    let mut claim = Vec::new();
    claim.extend_from_slice(b"HYF1");
    claim.extend_from_slice(&1u32.to_le_bytes());
    claim.extend_from_slice(&0u32.to_le_bytes());
    claim.extend_from_slice(&(MAX + 1).to_le_bytes());
    raw.write_all(&claim).await.unwrap();
    let mut buf = [0u8; 64];
    // Closed by the receiver (EOF or reset), without an acknowledgement.
    match timed(raw.read(&mut buf)).await {
        Ok(n) => assert_eq!(n, 0, "expected the connection to be closed"),
        Err(err) => assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}"),
    }
    // The endpoint goes on serving.
    timed(tx.send(Frame::default())).await.unwrap();
    assert_eq!(timed(rx.recv()).await.unwrap(), Frame::default());
}
