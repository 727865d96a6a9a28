//! Sign-in throttling: failed sign-ins are limited per client address, and, when failures
//! come from many addresses at once, limited for every address that has failed already,
//! never for one that has not (so an attacker elsewhere cannot lock an operator out).
//!
//! Per address (an IPv6 address counts by its /64, which one host usually holds whole): the
//! [`FREE_FAILURES`]th failure within [`WINDOW`] blocks the address for [`FIRST_BLOCK`], and
//! each later block is twice as long, up to [`LONGEST_BLOCK`]; a blocked address is refused
//! with `429` and `Retry-After` before its token is looked at, right or wrong. A success
//! forgets the address. The table holds at most [`MAX_ADDRESSES`]: past that, the entries
//! that block nothing go first, then the stalest.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Failures an address may make within [`WINDOW`]; the next one blocks it.
pub(crate) const FREE_FAILURES: usize = 5;
/// The window failures are counted in.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// How long an address is first blocked.
pub(crate) const FIRST_BLOCK: Duration = Duration::from_secs(60);
/// The longest block.
pub(crate) const LONGEST_BLOCK: Duration = Duration::from_secs(15 * 60);
/// Failures across all addresses within [`WINDOW`] past which an address that has failed
/// before is refused until the rate falls.
pub(crate) const GLOBAL_FAILURES: usize = 100;
/// Addresses remembered at most.
pub(crate) const MAX_ADDRESSES: usize = 10_000;

/// Who is signing in: an address, or none when the listener does not say.
pub(crate) type Client = Option<IpAddr>;

#[derive(Debug, Default)]
struct Entry {
    /// The latest failures, at most one more than are free, the oldest first.
    recent: VecDeque<Instant>,
    /// Until when the address is refused.
    blocked_until: Option<Instant>,
    /// Blocks so far, which double the next.
    blocks: u32,
    last_failure: Option<Instant>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Client, Entry>,
    /// Failures of every address in the current global window.
    global: Option<(Instant, usize)>,
}

/// The sign-in throttle of one console.
#[derive(Debug, Default)]
pub(crate) struct Throttle {
    state: Mutex<State>,
}

/// `client` as the throttle counts it: an IPv6 address by its /64.
fn key(client: Client) -> Client {
    match client? {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_none() => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            Some(IpAddr::V6(bits.into()))
        }
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4),
        v4 => Some(v4),
    }
}

/// How many events of a window starting at `window` are still counted at `now`.
fn counted(window: Option<(Instant, usize)>, now: Instant) -> usize {
    match window {
        Some((start, n)) if now.duration_since(start) < WINDOW => n,
        _ => 0,
    }
}

impl Throttle {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Every mutation leaves the table consistent before it can panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `client` may try a token at `now`; if not, how long until it may.
    pub(crate) fn admit(&self, client: Client, now: Instant) -> Result<(), Duration> {
        let state = self.lock();
        let Some(entry) = state.entries.get(&key(client)) else {
            return Ok(());
        };
        if let Some(until) = entry.blocked_until.filter(|until| *until > now) {
            return Err(until - now);
        }
        let overloaded = counted(state.global, now) >= GLOBAL_FAILURES;
        let failed_lately = entry
            .last_failure
            .is_some_and(|at| now.duration_since(at) < WINDOW);
        if overloaded && failed_lately {
            let (start, _) = state.global.unwrap_or((now, 0));
            return Err(WINDOW
                .saturating_sub(now.duration_since(start))
                .max(Duration::from_secs(1)));
        }
        Ok(())
    }

    /// Records a failed sign-in of `client` at `now`; how long it is now blocked for, if this
    /// failure blocked it.
    pub(crate) fn failed(&self, client: Client, now: Instant) -> Option<Duration> {
        let mut state = self.lock();
        let global = counted(state.global, now);
        state.global = Some(match state.global {
            Some((start, _)) if global > 0 => (start, global + 1),
            _ => (now, 1),
        });
        let client = key(client);
        if !state.entries.contains_key(&client) && state.entries.len() >= MAX_ADDRESSES {
            evict(&mut state.entries, now);
        }
        let entry = state.entries.entry(client).or_default();
        entry.last_failure = Some(now);
        // Any minute, not a minute on the clock: a burst across its turn counts whole.
        while (entry.recent.front()).is_some_and(|at| now.duration_since(*at) >= WINDOW) {
            entry.recent.pop_front();
        }
        entry.recent.push_back(now);
        if entry.recent.len() <= FREE_FAILURES {
            return None;
        }
        let block = FIRST_BLOCK
            .saturating_mul(2u32.saturating_pow(entry.blocks))
            .min(LONGEST_BLOCK);
        entry.blocks = entry.blocks.saturating_add(1);
        entry.blocked_until = Some(now + block);
        entry.recent.clear();
        Some(block)
    }

    /// Forgets `client`: it signed in.
    pub(crate) fn succeeded(&self, client: Client) {
        self.lock().entries.remove(&key(client));
    }

    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.lock().entries.len()
    }
}

/// Makes room in a full table: the entries blocking nothing and without a failure in the
/// window go first; if none, the one whose last failure is oldest.
fn evict(entries: &mut HashMap<Client, Entry>, now: Instant) {
    entries.retain(|_, entry| {
        entry.blocked_until.is_some_and(|until| until > now)
            || entry
                .last_failure
                .is_some_and(|at| now.duration_since(at) < WINDOW)
    });
    if entries.len() < MAX_ADDRESSES {
        return;
    }
    let stalest = entries
        .iter()
        .min_by_key(|(_, entry)| entry.last_failure)
        .map(|(client, _)| *client);
    if let Some(stalest) = stalest {
        entries.remove(&stalest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Client {
        Some(s.parse().expect("an address"))
    }

    #[test]
    fn the_sixth_failure_in_a_minute_blocks_the_address_and_blocks_grow() {
        let throttle = Throttle::default();
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        for n in 0..FREE_FAILURES {
            assert_eq!(throttle.admit(a, t0), Ok(()), "attempt {n}");
            assert_eq!(throttle.failed(a, t0), None);
        }
        assert_eq!(throttle.admit(a, t0), Ok(()));
        assert_eq!(throttle.failed(a, t0), Some(FIRST_BLOCK));
        assert_eq!(throttle.admit(a, t0), Err(FIRST_BLOCK));
        assert_eq!(
            throttle.admit(ip("192.0.2.2"), t0),
            Ok(()),
            "another address"
        );
        let later = t0 + FIRST_BLOCK;
        assert_eq!(throttle.admit(a, later), Ok(()));
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.failed(a, later), None);
        }
        assert_eq!(
            throttle.failed(a, later),
            Some(FIRST_BLOCK * 2),
            "twice as long"
        );
        throttle.succeeded(a);
        assert_eq!(
            throttle.admit(a, later),
            Ok(()),
            "a success forgets the address"
        );
    }

    #[test]
    fn failures_spread_beyond_the_window_never_block() {
        let throttle = Throttle::default();
        let a = ip("192.0.2.1");
        let t0 = Instant::now();
        for n in 0..20u32 {
            let at = t0 + WINDOW / 4 * n;
            assert_eq!(throttle.admit(a, at), Ok(()));
            assert_eq!(throttle.failed(a, at), None, "failure {n}");
        }
        // Five at the end of a minute and one at the start of the next: six within a minute.
        let b = ip("192.0.2.9");
        let edge = t0 + WINDOW - Duration::from_secs(1);
        for _ in 0..FREE_FAILURES {
            assert_eq!(throttle.failed(b, edge), None);
        }
        assert_eq!(
            throttle.failed(b, edge + Duration::from_secs(2)),
            Some(FIRST_BLOCK)
        );
    }

    #[test]
    fn an_ipv6_host_counts_by_its_64_and_a_mapped_ipv4_as_the_ipv4() {
        assert_eq!(key(ip("2001:db8::1")), key(ip("2001:db8::ffff:2")));
        assert_ne!(key(ip("2001:db8::1")), key(ip("2001:db8:0:1::1")));
        assert_eq!(key(ip("::ffff:192.0.2.1")), ip("192.0.2.1"));
    }

    #[test]
    fn a_flood_from_many_addresses_stops_repeaters_but_not_a_fresh_address() {
        let throttle = Throttle::default();
        let t0 = Instant::now();
        for n in 0..GLOBAL_FAILURES as u32 {
            let attacker = Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + n)));
            throttle.failed(attacker, t0);
        }
        let repeater = Some(IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000)));
        assert!(
            throttle.admit(repeater, t0).is_err(),
            "a failed address waits"
        );
        assert_eq!(
            throttle.admit(ip("198.51.100.7"), t0),
            Ok(()),
            "the operator tries"
        );
        assert_eq!(
            throttle.admit(repeater, t0 + WINDOW),
            Ok(()),
            "the flood is over"
        );
    }

    #[test]
    fn the_table_stays_bounded_whatever_the_number_of_addresses() {
        let throttle = Throttle::default();
        let t0 = Instant::now();
        for n in 0..(MAX_ADDRESSES as u32 + 500) {
            let client = Some(IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + n)));
            throttle.failed(client, t0);
        }
        assert!(throttle.remembered() <= MAX_ADDRESSES);
    }
}
