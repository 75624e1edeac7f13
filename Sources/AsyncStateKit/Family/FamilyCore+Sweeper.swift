import Foundation
public import Synchronization

/// Idle expiry: one sweeper task per family, sleeping until the oldest entry may have become idle.
extension FamilyCore {
    // MARK: Idle expiry

    /// Starts the sweeper if the family has an idle expiry and it is not running.
    @inlinable func startSweeperIfNeeded() {
        guard idleExpiry != nil else { return }
        let start = sweeper.withLock { sweeper in
            defer { sweeper.running = true }
            return !sweeper.running
        }
        guard start else { return }
        let task = Task(executorPreference: clock.executor) { [weak self, clock] in
            while let deadline = self?.nextSweep() {
                do {
                    try await clock.sleep(deadline)
                } catch {
                    // Cancelled (the family is gone), or a clock that cannot sleep: stop; the next new
                    // entry starts a sweeper again.
                    self?.sweeper.withLock { $0.running = false }
                    return
                }
                self?.sweep()
            }
        }
        sweeper.withLock { $0.task = task }
    }

    /// When the oldest entry may have become idle (never later; see ``FamilyShard``); `nil` (and the
    /// sweeper stops) when there is no entry.
    @inlinable func nextSweep() -> Duration? {
        guard let idleExpiry else { return nil }
        return sweeper.withLock { sweeper in
            let oldest = shards.compactMap { $0.withLock { $0.oldestAccess } }.min()
            if oldest == nil { sweeper.running = false }
            return oldest.map { $0.saturatingAdd(idleExpiry) }
        }
    }

    /// Removes every entry not accessed for the idle expiry. Entries used since the heap last placed
    /// them are placed again by their last use, up to an eighth of the idle expiry ahead, and at most
    /// 1,024 entries are looked at per hold of a shard's lock (so hits on the shard wait for no more).
    @inlinable func sweep() {
        guard let idleExpiry else { return }
        let now = clock.now()
        let deadline = now - idleExpiry
        let ahead = deadline.saturatingAdd(idleExpiry / 8)
        var removed = Shard.Removals()
        for shard in shards {
            var done = false
            while !done {
                shard.withLock { shard in
                    let (count, finished) = shard.removeIdle(
                        accessedBy: deadline, placingUntil: ahead, now: now, budget: 1_024, into: &removed)
                    population.subtract(count, ordering: .relaxed)
                    done = finished
                }
            }
        }
        report(removed)
    }
}
