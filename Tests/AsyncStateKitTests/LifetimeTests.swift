import AsyncStateTesting
import Foundation
import Testing

@testable import AsyncStateKit

@Suite struct LifetimeTests {
    @Test func anIdleStateIsFreedWithItsLastCopy() async throws {
        let clock = VirtualClock()
        weak var store: AsyncStateStore<Int>?
        do {
            let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
            let copy = state
            store = copy.store
            await state.fetch { 1 }
            _ = state.updates  // a subscriber nobody reads does not keep it alive either
        }
        #expect(store == nil)
    }

    /// A value the state no longer holds is released after the lock that readers take: its deinit
    /// is user code, which may read the state (`wrappedValue`, `phase`, `snapshot`). Before, the
    /// snapshot a write replaced was released under the cell's lock, and such a read waited for that
    /// lock forever.
    @Test func aReplacedValueIsReleasedOutsideTheLockReadersTake() async {
        /// Reads its state when it is freed, on another thread, waiting at most 10 s (real time,
        /// spent only if the read is blocked).
        final class Reader: Sendable {
            let state = LockedValue<AsyncState<Reader?>?>(nil)
            let answered = LockedValue<Bool?>(nil)
            deinit {
                guard let state = state.withLock({ $0 }) else { return }
                let read = LifetimeTests.answersWithin10Seconds { _ = state.phase }
                answered.withLock { $0 = read }
            }
        }
        let state = AsyncState<Reader?>(wrappedValue: nil, clock: VirtualClock())
        let answered: LockedValue<Bool?>
        do {
            let first = Reader()
            first.state.withLock { $0 = state }
            answered = first.answered
            await state.set(first)
        }
        await state.set(nil)  // the state held the last reference to `first`
        #expect(answered.withLock { $0 } == true)
    }

    /// A value a live entry's fetch replaced is released after the entry's store's lock too: its
    /// deinit may call the family's synchronous API for the same key (`invalidate`, `set`,
    /// `remove`), which takes that lock. Before, the snapshot was released after the cell's lock but
    /// under the store's, and such a call waited for the store's lock forever.
    @Test func aReplacedFamilyValueIsReleasedOutsideItsStoresLock() async throws {
        let clock = VirtualClock()
        let family = AsyncStateFamily<Int, CallsWhenFreed>(expiry: .seconds(3_600), clock: clock)
        let answered: LockedValue<Bool?>
        do {
            let first = CallsWhenFreed()
            first.call.withLock { $0 = { family.invalidate(1) } }
            answered = first.answered
            family.set(first, for: 1)
        }
        // The refresh keeps the entry live (its store holds the value) until its fetch settles and
        // replaces `first`, whose last reference the store's snapshot held.
        let refresh = clock.task {
            await family.refresh(for: 1) { _ in
                try await clock.sleep(for: .seconds(1))
                return CallsWhenFreed()
            }
        }
        await clock.advance(by: .seconds(1))
        try await refresh.value
        #expect(answered.withLock { $0 } == true)
    }

    /// The twin for an error: an entry keeps its last failure's error as its `lastError` once its
    /// phase has moved on, and a compact entry's is its last reference. When the entry is evicted
    /// (or removed as idle), the error is released with the removal, after the shard's lock: its
    /// deinit may call the family, which takes that lock. Before, it was released under the lock,
    /// and such a call waited for it forever.
    @Test func anEvictedEntrysLastErrorIsReleasedOutsideItsShardsLock() async throws {
        let clock = VirtualClock()
        // One entry at most, in one shard: a second key evicts the first.
        let family = AsyncStateFamily<Int, Int>(expiry: .seconds(3_600), capacity: 1, clock: clock)
        let answered: LockedValue<Bool?>
        do {
            let failure = CallsWhenFreed()
            failure.call.withLock { $0 = { family.invalidate(1) } }
            answered = failure.answered
            await #expect(throws: CallsWhenFreed.self) { try await family.value(for: 1) { _ in throw failure } }
        }
        // A success moves the phase on; the entry rests, its metadata holding the error alone.
        await family.refresh(for: 1) { _ in 1 }
        #expect(family.snapshot(for: 1)?.lastError is CallsWhenFreed)
        #expect(answered.withLock { $0 } == nil)
        #expect(try await family.value(for: 2) { _ in 2 } == 2)
        #expect(family.snapshot(for: 1) == nil)
        #expect(answered.withLock { $0 } == true)
    }

    /// A value or an error that makes its call when it is freed (its deinit is user code, which may
    /// call the state that held it), on another thread, and records whether the call answered within
    /// 10 s (real time, spent only if it is blocked).
    final class CallsWhenFreed: Error, Sendable {
        let call = LockedValue<(@Sendable () -> Void)?>(nil)
        let answered = LockedValue<Bool?>(nil)
        deinit {
            guard let call = call.withLock({ $0 }) else { return }
            let answeredInTime = LifetimeTests.answersWithin10Seconds(call)
            answered.withLock { $0 = answeredInTime }
        }
    }

    /// Runs `body` on a thread of its own and returns whether it returned within 10 s (real time,
    /// spent only if it is blocked): for a deinit that calls its state while it may hold a lock.
    static func answersWithin10Seconds(_ body: @escaping @Sendable () -> Void) -> Bool {
        let done = DispatchSemaphore(value: 0)
        let answered = LockedValue(false)
        Thread.detachNewThread {
            body()
            answered.withLock { $0 = true }
            done.signal()
        }
        _ = done.wait(timeout: .now() + 10)
        return answered.withLock { $0 }
    }

    @Test func aStateDroppedMidFlightIsFreedWhenItsOperationEnds() async throws {
        let clock = VirtualClock()
        let source = Source<Int>()
        weak var store: AsyncStateStore<Int>?
        var caller: Task<Int, any Error>?
        do {
            let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
            store = state.store
            let load = source.operation(on: clock, value: 4)
            caller = clock.task { try await state.value(load) }
            await clock.advance(by: .milliseconds(500))
        }
        #expect(store != nil)  // the operation's task still holds it
        await clock.advance(by: .milliseconds(500))
        #expect(try await caller?.value == 4)
        caller = nil
        await clock.settle()
        #expect(store == nil)
        #expect(clock.pendingSleepers == 0)
    }

    @Test func aCancelledFlightLeavesNoTaskOrSleeperBehind() async throws {
        let clock = VirtualClock()
        weak var store: AsyncStateStore<Int>?
        do {
            let state = AsyncState<Int>(wrappedValue: 0, clock: clock)
            store = state.store
            let source = Source<Int>()
            let caller = clock.task {
                try await state.value(source.operation(on: clock, delay: .seconds(3_600), value: 1))
            }
            await clock.advance(by: .seconds(1))
            caller.cancel()
            _ = await caller.result
        }
        await clock.settle()
        #expect(clock.pendingSleepers == 0)
        #expect(store == nil)
    }
}
