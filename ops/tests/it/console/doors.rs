//! Who the console answers: requests for another host refused before any page (DNS
//! rebinding), with and without sign-in, and sign-ins throttled per client address.

use super::*;

/// `request` sent as a page on another site would, after DNS rebinding, send it to `s`: its
/// own name in `Host` and `Origin`.
fn rebound(s: &Served, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let port = s.base.rsplit(':').next().expect("a port");
    let evil = format!("rebind.evil.example:{port}");
    request
        .header(reqwest::header::HOST, &evil)
        .header(ORIGIN, format!("http://{evil}"))
}

#[tokio::test]
async fn a_request_for_another_host_is_refused_before_any_page_even_with_a_session() {
    let s = serve().await;
    let cookie = s.sign_in(OPERATOR).await;
    let id = s.ids[1];
    let page = format!("/letters/{id}");
    let (_, body) = s.get(Some(&cookie), &page).await;
    let csrf = csrf_of(&body);
    let discard = s
        .client
        .post(format!("{}{page}/discard", s.base))
        .header(COOKIE, &cookie)
        .form(&[("csrf", csrf.as_str())]);
    let answer = rebound(&s, discard).send().await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::MISDIRECTED_REQUEST);
    let overview = rebound(
        &s,
        s.client.get(format!("{}/", s.base)).header(COOKIE, &cookie),
    );
    let answer = overview.send().await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::MISDIRECTED_REQUEST);
    let login = rebound(
        &s,
        s.client
            .post(format!("{}/login", s.base))
            .form(&[("token", OPERATOR)]),
    );
    let answer = login.send().await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::MISDIRECTED_REQUEST);
    assert!(
        answer.headers().get(SET_COOKIE).is_none(),
        "no session for another host"
    );
    assert_eq!(
        s.status(id).await,
        DeadLetterStatus::PendingReview,
        "nothing changed"
    );
    // `localhost` and the address itself are answered.
    let local = s.client.get(format!("{}/", s.base)).header(COOKIE, &cookie);
    let port = s.base.rsplit(':').next().expect("a port");
    let answer = local
        .header(reqwest::header::HOST, format!("localhost:{port}"))
        .send()
        .await
        .expect("an answer");
    assert_eq!(answer.status(), StatusCode::OK);
}

#[tokio::test]
async fn without_sign_in_a_rebound_page_gets_neither_a_page_nor_a_discard() {
    let store = MemoryStore::default();
    let queue = MemoryQueue::default();
    let id = store
        .record(fixtures::raw_letter(queue_name().as_str(), b"{}", "x"))
        .await
        .expect("recorded")
        .id();
    let router =
        Console::without_sign_in(Arc::new(store.clone()), Arc::new(queue.clone())).router();
    let base = listen(router).await;
    let s = Served {
        base,
        store,
        queue,
        client: reqwest::Client::new(),
        ids: vec![id],
    };
    let page = rebound(&s, s.client.get(format!("{}/letters/{id}", s.base)));
    assert_eq!(
        page.send().await.expect("an answer").status(),
        StatusCode::MISDIRECTED_REQUEST
    );
    let (status, body) = s.get(None, &format!("/letters/{id}")).await;
    assert_eq!(status, StatusCode::OK, "its own address is served");
    assert!(!body.contains("Sign out"), "nothing to sign out of: {body}");
    let discard = s
        .client
        .post(format!("{}/letters/{id}/discard", s.base))
        .form(&[("csrf", csrf_of(&body))]);
    let answer = rebound(&s, discard).send().await.expect("an answer");
    assert_eq!(answer.status(), StatusCode::MISDIRECTED_REQUEST);
    assert_eq!(
        s.status(id).await,
        DeadLetterStatus::PendingReview,
        "nothing discarded"
    );
}

/// A console over no letters whose listener reports peers' addresses, trusting `proxies`.
async fn throttled(proxies: Vec<std::net::IpAddr>) -> String {
    let queue = MemoryQueue::default();
    let tokens = vec![ConsoleToken::operator(OPERATOR).expect("a token")];
    let router = Console::new(Arc::new(MemoryStore::default()), Arc::new(queue), tokens)
        .trusted_proxies(proxies)
        .router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let base = format!("http://{}", listener.local_addr().expect("an address"));
    let app = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// A sign-in with `token` from the local address `from`, forwarded for `forwarded` if set:
/// its status and `Retry-After`.
async fn sign_in_from(
    base: &str,
    from: &str,
    forwarded: Option<&str>,
    token: &str,
) -> (StatusCode, Option<u64>, String) {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address(Some(from.parse().expect("an address")))
        .build()
        .expect("a client");
    let mut request = client
        .post(format!("{base}/login"))
        .header(ORIGIN, base)
        .form(&[("token", token)]);
    if let Some(forwarded) = forwarded {
        request = request.header("x-forwarded-for", forwarded);
    }
    let answer = request.send().await.expect("an answer");
    let retry_after =
        (answer.headers().get("retry-after")).and_then(|v| v.to_str().ok()?.parse().ok());
    (
        answer.status(),
        retry_after,
        answer.text().await.expect("a body"),
    )
}

#[tokio::test]
async fn wrong_tokens_from_one_address_are_throttled_and_another_address_still_signs_in() {
    let base = throttled(vec![]).await;
    for n in 1..=5 {
        let (status, _, _) = sign_in_from(&base, "127.0.0.1", None, "wrong-token-000000").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "failure {n}");
    }
    let (status, retry_after, page) =
        sign_in_from(&base, "127.0.0.1", None, "wrong-token-000000").await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the sixth within a minute"
    );
    assert!(
        retry_after.is_some_and(|s| s > 0 && s <= 60),
        "{retry_after:?}"
    );
    assert!(page.contains("id=\"throttled\""), "{page}");
    let (status, _, _) = sign_in_from(&base, "127.0.0.1", None, OPERATOR).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "a blocked address is refused before its token is looked at"
    );
    let (status, _, _) = sign_in_from(&base, "127.0.0.2", None, OPERATOR).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "another address signs in at once"
    );
}

#[tokio::test]
async fn behind_a_trusted_proxy_sign_ins_are_throttled_by_the_forwarded_address_only() {
    let base = throttled(vec!["127.0.0.1".parse().expect("an address")]).await;
    let attacker = Some("203.0.113.9, 127.0.0.1");
    for _ in 1..=5 {
        sign_in_from(&base, "127.0.0.1", attacker, "wrong-token-000000").await;
    }
    let (status, _, _) = sign_in_from(&base, "127.0.0.1", attacker, "wrong-token-000000").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let (status, _, _) = sign_in_from(&base, "127.0.0.1", Some("198.51.100.4"), OPERATOR).await;
    assert_eq!(
        status,
        StatusCode::SEE_OTHER,
        "the proxy's other clients sign in"
    );
    // A peer that is not a trusted proxy cannot choose its address by the header.
    for _ in 1..=6 {
        sign_in_from(&base, "127.0.0.3", Some("192.0.2.1"), "wrong-token-000000").await;
    }
    let (status, _, _) = sign_in_from(&base, "127.0.0.3", Some("192.0.2.2"), OPERATOR).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "throttled by its own address"
    );
}
