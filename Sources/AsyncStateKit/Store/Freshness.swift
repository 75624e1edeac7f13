/// Whether something that began at `since` is still within `expiry` at `now`: less than `expiry`
/// old. `nil` (never fetched, failed, invalidated, never restored) is never within it; with an
/// `expiry` of zero or less, only what `since` places after `now` is (data whose own lifetime moved
/// its freshness: see ``StoreConfiguration/freshnessShift(of:)``).
///
/// The one freshness test of the package. Every rule about age asks it:
/// - data's freshness, against the expiry — the machine's, every hit path's (a state's cell, a
///   family's compact record), and `hasExpired(in:)`'s against its interval;
/// - the hit window, against the refresh-ahead age (``StoreConfiguration/hitWindow``);
/// - a cached failure, against the failure expiry (``FetchStateMachine/cachedFailure(at:)``);
/// - fail-safe, the last good value's arrival against the maximum stale age
///   (``StateData/failSafeValue(at:maxStaleAge:)``);
/// - restored data, its restore against ``StoreConfiguration/restoredWindow``;
/// - a second-level entry, its age against its life on this replica
///   (``AttemptInput/arrival(succeededAt:freshUntil:version:lifetime:at:)``).
///
/// In attoseconds (`Int128`, inlined): `Duration`'s own `-` and `<` are calls into the standard
/// library, two on every hit. The subtraction traps on overflow as `Duration`'s does.
@inlinable
func isWithinExpiry(since start: Duration?, at now: Duration, expiry: Duration) -> Bool {
    guard let start else { return false }
    return now.attoseconds - start.attoseconds < expiry.attoseconds
}
