public import Foundation

/// Data at rest, packed: what a family's compact entry keeps (see ``FamilyShard``). Its value and its
/// freshness live in the entry's record, where the hit path reads them; the rest lives here, off the
/// hit path. Packing, unpacking and the snapshot of packed data are this file's, and only this
/// file's: a field added to ``StateData`` does not compile until ``init(value:freshSince:packed:)``
/// unpacks it, which needs it here.
extension StateData {
    /// What data at rest keeps besides its value and freshness. At rest, its failure fields are empty
    /// (no failure, no failed attempt), it has a value, and whether that value is empty is what its
    /// phase says; so those are not kept. Optionals are kept as values with a sentinel for "none": as
    /// optionals, each would take a byte more, and with alignment eight. The two instants are
    /// ``WholeNanoseconds`` (8 bytes each), the date seconds since the reference date (NaN for none).
    @usableFromInline
    struct Packed {
        @usableFromInline var phase: AsyncPhase
        @usableFromInline var lastError: (any Error)?
        @usableFromInline var lastSuccessSeconds: Double
        @usableFromInline var successCount: Int
        @usableFromInline var restoredAt: WholeNanoseconds
        @usableFromInline var receivedAt: WholeNanoseconds
        @usableFromInline var version: UInt64

        /// Every field, no defaults.
        @inlinable
        init(
            phase: AsyncPhase, lastError: (any Error)?, lastSuccessSeconds: Double, successCount: Int,
            restoredAt: WholeNanoseconds, receivedAt: WholeNanoseconds, version: UInt64
        ) {
            (self.phase, self.lastError, self.lastSuccessSeconds) = (phase, lastError, lastSuccessSeconds)
            (self.successCount, self.restoredAt, self.receivedAt, self.version) = (
                successCount, restoredAt, receivedAt, version
            )
        }

        /// The wall date of the last success, if any.
        @inlinable
        var lastSuccess: Date? {
            lastSuccessSeconds.isNaN ? nil : Date(timeIntervalSinceReferenceDate: lastSuccessSeconds)
        }

        /// The snapshot at `now` of the data at rest that this packs with `value` and `freshSince`,
        /// for data that stays fresh for `expiry`: what ``StateData/snapshot(at:expiry:isLoading:)``
        /// of the unpacked data gives, without unpacking it first (a compact entry's snapshot hit is
        /// made this way).
        @inlinable
        func snapshot(value: Value, freshSince: Duration?, at now: Duration, expiry: Duration) -> AsyncSnapshot<Value> {
            AsyncSnapshot(
                value: value, phase: phase, isExpired: !isWithinExpiry(since: freshSince, at: now, expiry: expiry),
                failureCount: 0, lastError: lastError, lastSuccess: lastSuccess, successCount: successCount,
                hasValue: true)
        }
    }

    /// This data, at rest (``isAtRest``), packed.
    @inlinable var packed: Packed {
        precondition(isAtRest, "only data at rest is packed")
        return Packed(
            phase: phase, lastError: lastError, lastSuccessSeconds: lastSuccess?.timeIntervalSinceReferenceDate ?? .nan,
            successCount: successCount, restoredAt: WholeNanoseconds(restoredAt),
            receivedAt: WholeNanoseconds(receivedAt), version: version)
    }

    /// The data at rest that `packed` keeps with `value` and `freshSince`.
    @inlinable
    init(value: Value, freshSince: Duration?, packed: Packed) {
        self.init(
            value: value, phase: packed.phase, freshSince: freshSince, receivedAt: packed.receivedAt.duration,
            failedAt: nil, restoredAt: packed.restoredAt.duration, hasValue: true,
            valueIsEmpty: packed.phase.kind == .empty, failureCount: 0, lastError: packed.lastError,
            lastSuccess: packed.lastSuccess, successCount: packed.successCount, version: packed.version)
    }
}
