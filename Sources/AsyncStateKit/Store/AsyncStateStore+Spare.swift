import Foundation

/// How a family keeps the store of an entry that became compact, and makes it anew for the next
/// entry made live (see ``FamilyShard/spareStores``): every change to the machine goes through its
/// events (``FetchStateMachine/park()``, ``FetchStateMachine/reseed(_:)``,
/// ``FetchStateMachine/wake(restoring:)``).
extension AsyncStateStore {
    /// A family's store for an entry made live: `spare` made anew if there is one (see
    /// ``renew(seed:observation:)``), else a new store. Its data is `data`, at rest (see
    /// ``FetchStateMachine/restingData``: a compact entry's), if given; else the initial data. A spare
    /// must be a store that nobody else references, on the same clock and configuration, observed if
    /// `observation` is not `nil`, and emptied by ``park()`` (a family keeps the stores of its
    /// entries that became compact: see ``FamilyShard/spareStores``).
    @inlinable static func make(
        restoring data: StateData<Value>?, initialValue: Value, configuration: StoreConfiguration<Value>,
        clock: StoreClock, seed: UInt64, observation: Observation?, reusing spare: AsyncStateStore?
    ) -> AsyncStateStore {
        let store: AsyncStateStore
        if let spare {
            spare.renew(seed: seed, observation: observation)
            store = spare
        } else {
            store = AsyncStateStore(
                Machine(initialValue: initialValue, configuration: configuration, seed: seed), clock: clock,
                observation: observation)
        }
        guard let data else { return store }
        // A machine at rest is its data and nothing else (no flight, no abandoned operation): given
        // a compact entry's data, it is the machine that entry's store had when it rested. What the
        // data and the snapshot replace are a new or parked store's initial ones, which hold no value
        // of the user's (a family's initial value is `nil`), so they may go here, under the shard's
        // lock.
        var effects = Effects()
        store.core.withLock { core in
            core.machine.wake(restoring: data)
            store.publish(core.machine.publication(at: clock.now()), in: &effects)
        }
        return store
    }

    /// What a store held when its family kept it as a spare (``park()``): the last key's data and
    /// published contents, released by whoever holds this once its lock is released.
    @usableFromInline
    struct Leftovers {
        @usableFromInline var data: StateData<Value>
        @usableFromInline var contents: SnapshotCell<Value>.Contents

        @inlinable init(data: StateData<Value>, contents: SnapshotCell<Value>.Contents) {
            (self.data, self.contents) = (data, contents)
        }
    }

    /// Empties this store as its family keeps it as a spare (``FamilyShard/spareStores``): the cell's
    /// contents become initial and the machine's data the initial data, and its event queue forgets
    /// the key and its last fetch, so that a spare keeps no key's value, error, metadata or fetch
    /// alive (a key removed or evicted while its old store waits to be reused is freed with its
    /// entry). Only for a store that nobody else references, at rest. Returns what it held: a value's
    /// deinit is user code, so the caller releases it after its lock.
    @inlinable func park() -> Leftovers {
        events?.park()
        let (data, initialValue) = core.withLock { ($0.machine.park(), $0.machine.initialValue) }
        return Leftovers(data: data, contents: cell.renew(value: initialValue))
    }

    /// Makes this store, emptied by ``park()``, what ``init(_:clock:observation:)`` makes around a
    /// new machine on the same configuration, seeded with `seed`: its events reported as
    /// `observation` (the new key's). Parked, its machine already is such a machine but for the seed
    /// — initial data, no flight, no abandoned operation — and its table of waiters is empty, so only
    /// the seed changes. What the store keeps — its clock, its cell's expiry and hit window, whether
    /// it is observed — is the same for every store of a family. Only for a store that nobody else
    /// references: no task, timer, waiter or reader can reach it, so nothing sees the change. Waiter
    /// ids go on counting, so that an observer never sees two callers of this object with the same
    /// ``AsyncStateEvent/Waiter``.
    @inlinable func renew(seed: UInt64, observation: Observation?) {
        precondition((events == nil) == (observation == nil), "a spare store is observed as its family is")
        if let events, let observation { events.renew(observation) }
        core.withLock { core in
            precondition(core.waiterSlots.isEmpty, "a spare store with waiters")
            core.machine.reseed(seed)
        }
    }

    /// Whether a family's entry is in use: `users` callers hold it (the family's count of callers
    /// between a pin and its unpin), or its store has a flight (``FetchStateMachine/hasFlight``). The
    /// one definition of "in use" (see ``FamilyShard/isInUse(_:table:users:)``): an entry in use is
    /// never evicted, swept as idle, or made compact.
    @inlinable static func isInUse(users: Int32, hasFlight: Bool) -> Bool { users > 0 || hasFlight }

    /// The store's data if its family entry may rest (become compact), else `nil`: the one place that
    /// decides it. It may when it is not in use (``isInUse(users:hasFlight:)``), nobody listens (no
    /// `updates` subscriber), and the machine may (``FetchStateMachine/restingData``: no abandoned
    /// operation, data at rest). One lock: a family's miss asks it as each caller's use ends.
    @inlinable func restingData(users: Int32) -> StateData<Value>? {
        core.withLock { core in
            guard !Self.isInUse(users: users, hasFlight: core.machine.hasFlight), cell.subscriberCount == 0 else {
                return nil
            }
            return core.machine.restingData
        }
    }
}
