//! The listeners' accept loop over real sockets: a head trickled past the header-read timeout
//! is closed, an idle keep-alive connection is closed, connections beyond the cap get `503`,
//! and every request knows its peer. Short limits keep it quick; the defaults are 10 s and 256.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::routing::get;
use jobs_ops::listen::{ListenerLimits, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn served(limits: ListenerLimits) -> SocketAddr {
    let app = Router::new().route(
        "/",
        get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let addr = listener.local_addr().expect("an address");
    tokio::spawn(serve(listener, app, limits, std::future::pending()));
    addr
}

/// Everything `stream` receives until the server closes it; panics if it does not within
/// 5 s.
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 1024];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    });
    read.await.expect("the server closed the connection");
    String::from_utf8_lossy(&seen).into_owned()
}

const LIMITS: ListenerLimits = ListenerLimits {
    header_read_timeout: Duration::from_millis(500),
    max_connections: 2,
};

#[tokio::test]
async fn a_head_trickled_past_the_timeout_is_closed_unanswered() {
    let addr = served(LIMITS).await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let head = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
    let mut closed = false;
    for byte in head.iter().chain(b"aaaaaaaaaaaaaaaaaaaa".iter()) {
        if stream.write_all(&[*byte]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answer = until_closed(&mut stream).await;
    assert!(
        closed || !answer.contains("200 OK"),
        "a trickled head got an answer: {answer}"
    );
}

#[tokio::test]
async fn a_request_is_answered_with_its_peer_and_an_idle_keep_alive_connection_is_closed() {
    let addr = served(LIMITS).await;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let me = stream.local_addr().expect("an address");
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("write");
    let answer = until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(
        answer.ends_with(&me.to_string()),
        "the handler saw its peer: {answer}"
    );
}

#[tokio::test]
async fn connections_beyond_the_cap_are_answered_503_and_a_freed_slot_serves_again() {
    let addr = served(LIMITS).await;
    let first = TcpStream::connect(addr).await.expect("connect");
    let second = TcpStream::connect(addr).await.expect("connect");
    let mut third = TcpStream::connect(addr).await.expect("connect");
    let answer = until_closed(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    drop((first, second));
    // The slots come back when the server sees the connections end.
    let mut served_again = false;
    for _ in 0..50 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        if until_closed(&mut stream).await.starts_with("HTTP/1.1 200") {
            served_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served_again, "a closed connection gives its slot back");
}
