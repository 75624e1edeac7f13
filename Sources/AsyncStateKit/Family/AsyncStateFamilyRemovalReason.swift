/// Why an entry left an ``AsyncStateFamily`` (or had its value replaced), as reported to its
/// `onRemoval` callback.
public enum AsyncStateFamilyRemovalReason: Hashable, CaseIterable, Sendable {
    /// The family was over its capacity and its eviction policy (W-TinyLFU) chose this entry, which
    /// had no fetch in flight.
    case evicted
    /// The entry was not read for the family's idle expiry.
    case idle
    /// ``AsyncStateFamily/remove(_:)`` or ``AsyncStateFamily/removeAll()`` removed it.
    case removed
    /// ``AsyncStateFamily/set(_:for:)`` replaced its value (the entry stays).
    case replaced
}
