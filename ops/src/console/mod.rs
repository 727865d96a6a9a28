//! The operations console: why jobs failed, and putting them back safely, in a browser.
//!
//! [`Console::router`] is an axum [`Router`] a module binary (or `jobsctl console`) mounts:
//! server-rendered pages, one small embedded script (the overview's refresh), no external
//! asset. It shows each queue's depth by state and wait where the transport reports them, with
//! the pending letters counted by queue and by error with what varies stripped (the overview,
//! `overview.rs`); the dead letters newest first with filters (status, queue, tenant, kind, a
//! job or correlation id), one letter in full (its
//! envelope, its raw bytes as text or hex), and replays or discards a letter through
//! [`DeadLetters`], as `jobsctl dead-letters` does ([`crate::bulk`] for both; the pages in
//! `letters.rs`); bulk runs over a filter (`bulk.rs`); the cron tasks and each tenant's
//! freshness tier (`cron.rs`).
//!
//! Safety: every page but sign-in needs a session, made from a [`ConsoleToken`] of the
//! configuration (`401` without one); a token scoped to a tenant sees and touches that
//! tenant's letters, runs and tier only, everywhere (another's letter is `404`), and no queue
//! figures, which are not per tenant. Every state-changing request is a POST that must come
//! from the console's own origin and carry the session's form token. Every value is escaped
//! by construction (the pages are maud markup, `html.rs`), and the pages are served with a
//! `Content-Security-Policy` that runs no inline script, so markup in a payload or an error
//! renders as text.

mod auth;
mod bulk;
mod cron;
mod html;
mod letters;
mod overview;
mod throttle;

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use axum::Router;
use axum::extract::{ConnectInfo, Form, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION, RETRY_AFTER, SET_COOKIE};
use axum::http::{Extensions, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::{DateTime, Utc};
use jobs_consumers::DeadLetters;
use jobs_core::{
    BulkRuns, CorrelationId, DeadLetterFilter, DeadLetterId, DeadLetterReason, DeadLetterStatus,
    DeadLetterStore, JobId, Kind, QueueDepth, QueueName, QueuePort, TenantDirectory, TenantId,
};
use serde::Deserialize;

use crate::bulk::Resolver;

pub use auth::{ConsoleToken, MIN_SECRET_LEN};

use crate::hosts::{AllowedHosts, PublicUrl};
use auth::{Gate, Session};
use html::page;
use maud::html;
use overview::{overview, queue_rows, queues_json};

/// Letters a list page shows.
const PAGE_SIZE: u32 = 50;
/// The newest pending letters the overview's grouped counts are taken over.
const COUNTED: u32 = 5_000;
/// How often the queues' depth is sampled for the overview's chart.
const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// Samples kept per queue: the last ten minutes.
const SAMPLES: usize = 120;
/// Replays a bulk run publishes a second, unless [`Console::replay_rate`] says otherwise.
pub const DEFAULT_REPLAY_RATE: u32 = 20;

/// The console over a store's dead letters and a transport.
pub struct Console {
    dead_letters: Arc<dyn DeadLetterStore>,
    actions: DeadLetters,
    depth: Option<Arc<dyn QueueDepth>>,
    queues: Vec<QueueName>,
    gate: Gate,
    /// Each queue's recent depth (every message not yet acked), oldest first, sampled every
    /// [`SAMPLE_EVERY`] from the first overview on.
    samples: Mutex<HashMap<QueueName, VecDeque<u64>>>,
    sampling: std::sync::Once,
    runs: Option<Arc<dyn BulkRuns>>,
    tenants: Option<Arc<dyn TenantDirectory>>,
    replay_rate: u32,
    executing: bulk::Executing,
    throttle: throttle::Throttle,
    trusted_proxies: Vec<IpAddr>,
    hosts: AllowedHosts,
}

impl Console {
    /// A console whose operators sign in with one of `tokens`, over `dead_letters`, replaying
    /// through `publisher`.
    pub fn new(
        dead_letters: Arc<dyn DeadLetterStore>,
        publisher: Arc<dyn QueuePort>,
        tokens: Vec<ConsoleToken>,
    ) -> Self {
        Console {
            actions: DeadLetters::new(dead_letters.clone(), publisher),
            dead_letters,
            depth: None,
            queues: vec![],
            gate: Gate::new(tokens),
            samples: Mutex::default(),
            sampling: std::sync::Once::new(),
            runs: None,
            tenants: None,
            replay_rate: DEFAULT_REPLAY_RATE,
            executing: bulk::Executing::default(),
            throttle: throttle::Throttle::default(),
            trusted_proxies: vec![],
            hosts: AllowedHosts::new(),
        }
    }

    /// Starts sampling the queues' depth, once, for as long as the console lives.
    fn sample(self: &Arc<Self>) {
        if self.depth.is_none() {
            return;
        }
        self.sampling.call_once(|| {
            let console = Arc::downgrade(self);
            tokio::spawn(async move {
                let mut every = tokio::time::interval(SAMPLE_EVERY);
                loop {
                    every.tick().await;
                    let Some(console) = console.upgrade() else {
                        return;
                    };
                    for (name, depth) in queue_rows(&console).await {
                        console.record(name, depth.map_or(0, |d| d.total()));
                    }
                }
            });
        });
    }

    fn record(&self, queue: QueueName, total: u64) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        let line = samples.entry(queue.clone()).or_default();
        line.push_back(total);
        while line.len() > SAMPLES {
            line.pop_front();
        }
        // Empty for the whole window: forgotten, so the samples stay bounded by the queues
        // that held messages in the last ten minutes.
        if line.len() == SAMPLES && line.iter().all(|n| *n == 0) {
            samples.remove(&queue);
        }
    }

    /// The queues that held messages at some sample of the last ten minutes: the overview
    /// keeps them after they drain (the transport lists only queues holding messages now).
    fn recent(&self) -> Vec<QueueName> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        (samples.iter())
            .filter(|(_, line)| line.iter().any(|n| *n > 0))
            .map(|(queue, _)| queue.clone())
            .collect()
    }

    /// `queue`'s samples, oldest first.
    fn history(&self, queue: &QueueName) -> Vec<u64> {
        self.samples
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(queue)
            .map(|line| line.iter().copied().collect())
            .unwrap_or_default()
    }

    /// A console without sign-in: every visitor is an operator. Only for a console bound to a
    /// loopback address (`jobsctl console --no-auth` refuses any other).
    pub fn without_sign_in(
        dead_letters: Arc<dyn DeadLetterStore>,
        publisher: Arc<dyn QueuePort>,
    ) -> Self {
        Console {
            gate: Gate::open(),
            ..Console::new(dead_letters, publisher, vec![])
        }
    }

    /// Shows the depth of `queues` (and of every queue `depth` lists, and of those that held
    /// messages in the last ten minutes) on the overview.
    pub fn depth(mut self, depth: Arc<dyn QueueDepth>, queues: Vec<QueueName>) -> Self {
        self.depth = Some(depth);
        self.queues = queues;
        self
    }

    /// Offers bulk replays and discards of every letter a filter matches, journaled in `runs`
    /// so that every console instance and `jobsctl` see them and can resume them.
    pub fn bulk_runs(mut self, runs: Arc<dyn BulkRuns>) -> Self {
        self.runs = Some(runs);
        self
    }

    /// Shows on the cron page each tenant of `directory` with the freshness tier its
    /// entitlement gives it and its next recompute.
    pub fn tenants(mut self, directory: Arc<dyn TenantDirectory>) -> Self {
        self.tenants = Some(directory);
        self
    }

    /// Publishes a bulk run's replays at most `per_second` a second (at least 1), so that a
    /// thousand replays do not land on the queue at once; [`DEFAULT_REPLAY_RATE`] unless set.
    pub fn replay_rate(mut self, per_second: u32) -> Self {
        self.replay_rate = per_second.max(1);
        self
    }

    /// Answers requests whose `Host` is one of `hosts` besides IP literals and `localhost`
    /// (the console's names behind a proxy, say); any other gets `421` before a page runs, so
    /// a page on another site cannot reach the console by DNS rebinding
    /// ([`AllowedHosts`]).
    pub fn allowed_hosts(mut self, hosts: AllowedHosts) -> Self {
        self.hosts = hosts;
        self
    }

    /// Tells the console where operators reach it when that is not the listener's own
    /// address (behind a TLS-terminating proxy): its origin is accepted on forms, and an
    /// https one makes the session cookie `Secure` with the `__Host-` prefix.
    pub fn public_url(mut self, url: PublicUrl) -> Self {
        self.gate.reached_at(url);
        self
    }

    /// Takes the client's address from `X-Forwarded-For` when the connection comes from one
    /// of `proxies` (a TLS-terminating proxy in front of the console): the address sign-ins
    /// are throttled and logged by. Without it, or from any other peer, the peer's own.
    pub fn trusted_proxies(mut self, proxies: Vec<IpAddr>) -> Self {
        self.trusted_proxies = proxies;
        self
    }

    /// The address a request comes from: the peer the listener reports
    /// (`into_make_service_with_connect_info::<SocketAddr>`), or, from a trusted proxy, the
    /// nearest address it forwarded that is not itself a trusted proxy.
    fn client(&self, headers: &HeaderMap, extensions: &Extensions) -> throttle::Client {
        let peer = extensions.get::<ConnectInfo<SocketAddr>>()?.0.ip();
        if !self.trusted_proxies.contains(&peer) {
            return Some(peer);
        }
        let forwarded = (headers.get_all("x-forwarded-for").iter())
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|hop| hop.trim().parse::<IpAddr>().ok())
            .collect::<Vec<_>>();
        let nearest = forwarded
            .into_iter()
            .rev()
            .find(|hop| !self.trusted_proxies.contains(hop));
        Some(nearest.unwrap_or(peer))
    }

    /// The console's routes, to mount at the root of a listener (its links are absolute).
    /// Sign-ins are throttled by client address when the listener reports it
    /// (`into_make_service_with_connect_info::<SocketAddr>`); without it, every client
    /// counts as one.
    pub fn router(self) -> Router {
        let router = Router::new()
            .route("/", get(overview))
            .route("/login", get(login_form).post(login))
            .route("/logout", post(logout))
            .route("/queues.json", get(queues_json))
            .route("/letters", get(letters::letters))
            .route("/letters/{id}", get(letters::letter))
            .route("/letters/{id}/replay", post(letters::replay))
            .route("/letters/{id}/discard", post(letters::discard))
            .route("/bulk", post(bulk::ask))
            .route("/bulk/confirm", post(bulk::start))
            .route("/runs", get(bulk::runs_page))
            .route("/runs/{id}", get(bulk::run_page))
            .route("/runs/{id}/resume", post(bulk::resume))
            .route("/cron", get(cron::cron))
            .route("/assets/console.css", get(css))
            .route("/assets/console.js", get(js))
            .layer(axum::middleware::map_response(plain_as_page));
        let hosts = self.hosts.clone();
        hosts.guard(router.with_state(Arc::new(self)))
    }
}

/// A plain-text error (what axum's extractors answer for a form, query or path that does not
/// parse, quoting the input) as the console's own error page, with its headers, saying what
/// kind of request was refused and quoting nothing.
async fn plain_as_page(response: Response) -> Response {
    let plain = (response.headers().get(CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("text/plain"));
    let status = response.status();
    if !plain || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let why = match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => {
            "the request's address or form does not fit this page"
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "the request is not a form",
        StatusCode::PAYLOAD_TOO_LARGE => "the request is too large",
        StatusCode::FORBIDDEN => "cross-site request refused: reload the page and try again",
        StatusCode::METHOD_NOT_ALLOWED => "this page does not take that method",
        _ => "the request was refused",
    };
    let title = status.canonical_reason().unwrap_or("Error");
    let mut page = html_page(status, page(title, None, html! { p.error { (why) } }));
    // What the refusal said besides its body (an `Allow`, a `Retry-After`) stays.
    for (name, value) in response.headers() {
        if name != CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            page.headers_mut().entry(name).or_insert(value.clone());
        }
    }
    page
}

type Shared = State<Arc<Console>>;

/// A page, with the headers every page carries.
fn html_page(status: StatusCode, body: String) -> Response {
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
             img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn redirect(to: &str) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(location) = HeaderValue::from_str(to) {
        response.headers_mut().insert(LOCATION, location);
    }
    response
}

/// The sign-in page, as the answer to a request without a session.
fn unauthorised() -> Response {
    html_page(
        StatusCode::UNAUTHORIZED,
        page(
            "Sign in",
            None,
            html! {
                p { "Sign in with a console token." }
                form method="post" action="/login" {
                    label { "Token " input type="password" name="token" autocomplete="off"; }
                    button { "Sign in" }
                }
            },
        ),
    )
}

fn problem(status: StatusCode, session: &Session, message: &str) -> Response {
    html_page(
        status,
        page(
            status.canonical_reason().unwrap_or("Error"),
            Some(session),
            html! { p.error { (message) } },
        ),
    )
}

async fn css() -> Response {
    ([(CONTENT_TYPE, "text/css; charset=utf-8")], html::CSS).into_response()
}

async fn js() -> Response {
    ([(CONTENT_TYPE, "text/javascript; charset=utf-8")], html::JS).into_response()
}

async fn login_form(State(console): Shared, headers: HeaderMap) -> Response {
    if console.gate.session(&headers).is_some() {
        return redirect("/");
    }
    let mut answer = unauthorised();
    *answer.status_mut() = StatusCode::OK;
    answer
}

#[derive(Deserialize)]
struct Login {
    token: String,
}

async fn login(
    State(console): Shared,
    headers: HeaderMap,
    extensions: Extensions,
    Form(form): Form<Login>,
) -> Response {
    if !console.gate.same_origin(&headers, &console.hosts) {
        return (StatusCode::FORBIDDEN, "cross-site request refused").into_response();
    }
    let client = console.client(&headers, &extensions);
    let shown = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
    let now = std::time::Instant::now();
    if let Err(wait) = console.throttle.admit(client, now) {
        tracing::warn!(client = %shown, retry_after = ?wait, "console sign-in throttled");
        return too_many_sign_ins(wait);
    }
    match console.gate.sign_in(&form.token) {
        Some(id) => {
            console.throttle.succeeded(client);
            let mut answer = redirect("/");
            if let Ok(cookie) = HeaderValue::from_str(&console.gate.session_cookie(&id)) {
                answer.headers_mut().insert(SET_COOKIE, cookie);
            }
            answer
        }
        None => match console.throttle.failed(client, now) {
            Some(wait) => {
                tracing::warn!(client = %shown, blocked_for = ?wait, "console sign-in refused: unknown token; the address is throttled");
                too_many_sign_ins(wait)
            }
            None => {
                tracing::warn!(client = %shown, "console sign-in refused: unknown token");
                unauthorised()
            }
        },
    }
}

/// The answer to a throttled sign-in: `429`, when to come back, and the sign-in form.
fn too_many_sign_ins(wait: std::time::Duration) -> Response {
    let seconds = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    let mut answer = html_page(
        StatusCode::TOO_MANY_REQUESTS,
        page(
            "Too many sign-ins",
            None,
            html! {
                p.error #throttled {
                    "Too many failed sign-ins from this address: try again in " (seconds) " s."
                }
            },
        ),
    );
    if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
        answer.headers_mut().insert(RETRY_AFTER, value);
    }
    answer
}

#[derive(Deserialize)]
struct Csrf {
    csrf: String,
}

/// The session of a state-changing request, or the answer refusing it.
fn authorised_post(
    console: &Console,
    headers: &HeaderMap,
    csrf: &str,
) -> Result<Session, Box<Response>> {
    let Some(session) = console.gate.session(headers) else {
        return Err(Box::new(unauthorised()));
    };
    if !console.gate.same_origin(headers, &console.hosts)
        || !auth::constant_time_eq(session.csrf.as_bytes(), csrf.as_bytes())
    {
        return Err(Box::new(problem(
            StatusCode::FORBIDDEN,
            &session,
            "cross-site request refused: reload the page and try again",
        )));
    }
    Ok(session)
}

async fn logout(State(console): Shared, headers: HeaderMap, Form(form): Form<Csrf>) -> Response {
    if let Err(refused) = authorised_post(&console, &headers, &form.csrf) {
        return *refused;
    }
    console.gate.sign_out(&headers);
    let mut answer = redirect("/login");
    if let Ok(cookie) = HeaderValue::from_str(&console.gate.cleared_cookie()) {
        answer.headers_mut().insert(SET_COOKIE, cookie);
    }
    answer
}

/// The list page's query: every field optional, as a form sends it (empty means unset).
#[derive(Deserialize, Default)]
struct ListQuery {
    status: Option<String>,
    queue: Option<String>,
    tenant: Option<String>,
    kind: Option<String>,
    /// A job id or a correlation id.
    q: Option<String>,
    /// Why the letters were dead-lettered (`DeadLetterReason`).
    reason: Option<String>,
    before: Option<i64>,
    since: Option<String>,
}

fn set(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

/// The filter a list query asks for, or what is wrong with it (naming the field).
fn filter_of(query: &ListQuery, session: &Session) -> Result<DeadLetterFilter, String> {
    let mut filter = DeadLetterFilter {
        newest_first: true,
        limit: PAGE_SIZE,
        before: query.before.map(DeadLetterId),
        ..DeadLetterFilter::default()
    };
    if let Some(status) = set(&query.status) {
        filter.status = Some(
            [
                DeadLetterStatus::PendingReview,
                DeadLetterStatus::Replayed,
                DeadLetterStatus::Discarded,
            ]
            .into_iter()
            .find(|s| s.as_str() == status)
            .ok_or_else(|| {
                format!("status: `{status}` is none of pending_review, replayed, discarded")
            })?,
        );
    }
    if let Some(queue) = set(&query.queue) {
        filter.queue = Some(
            queue
                .parse::<QueueName>()
                .map_err(|e| format!("queue: {e}"))?,
        );
    }
    if let Some(kind) = set(&query.kind) {
        filter.kind = Some(kind.parse::<Kind>().map_err(|e| format!("kind: {e}"))?);
    }
    if let Some(reason) = set(&query.reason) {
        filter.reason = Some(
            reason
                .parse::<DeadLetterReason>()
                .map_err(|e| format!("reason: {e}"))?,
        );
    }
    if let Some(tenant) = set(&query.tenant) {
        filter.tenant_id = Some(
            tenant
                .parse::<TenantId>()
                .map_err(|e| format!("tenant: {e}"))?,
        );
    }
    if let Some(q) = set(&query.q) {
        if let Ok(job) = q.parse::<JobId>() {
            filter.job_id = Some(job);
        } else {
            filter.correlation_id = Some(
                q.parse::<CorrelationId>()
                    .map_err(|e| format!("job or correlation id: {e}"))?,
            );
        }
    }
    // A tenant's session sees its own letters, whatever the query says.
    if let Some(own) = session.tenant {
        filter.tenant_id = Some(own);
    }
    Ok(filter)
}

fn time(t: SystemTime) -> String {
    DateTime::<Utc>::from(t)
        .format("%Y-%m-%d %H:%M:%S UTC")
        .to_string()
}

/// Who a session's changes are recorded as, in the letter's history.
fn who(session: &Session) -> String {
    match (&session.name, session.tenant) {
        (Some(name), Some(tenant)) => format!("console ({name}, tenant {tenant})"),
        (Some(name), None) => format!("console ({name})"),
        (None, Some(tenant)) => format!("console (tenant {tenant})"),
        (None, None) => "console (operator)".to_owned(),
    }
}

/// Who acts for `session`: as it (in the letters' history), within its tenant's letters.
fn resolver(console: &Console, session: &Session) -> Resolver {
    Resolver::new(&console.actions, who(session), session.tenant)
}
