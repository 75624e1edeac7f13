/// The policies a state is declared with, normalized: bad values already clamped or switched off.
struct StoreConfiguration<Value: Sendable>: Sendable {
    /// How long data stays fresh; zero or less means never fresh.
    var expiry: Duration
    /// Decides whether a successful value is empty.
    var isEmpty: @Sendable (Value) -> Bool
    /// The retry policy of fetches whose caller gives none.
    var retry: RetryPolicy = .never
    /// The longest an attempt may run; `nil` for no limit.
    var timeout: Duration?
    /// Whether `value` serves stale data at once and refreshes it in the background.
    var staleWhileRevalidate = false
    /// How long after a fetch settles the next background refresh starts; `nil` for none.
    var refreshInterval: Duration?

    /// Normalizes: a zero or negative `timeout` or `refreshInterval` means none (documented on
    /// ``AsyncState``), so neither can fail every attempt at once nor spin.
    init(
        expiry: Duration, isEmpty: @escaping @Sendable (Value) -> Bool, retry: RetryPolicy = .never,
        timeout: Duration? = nil, staleWhileRevalidate: Bool = false, refreshInterval: Duration? = nil
    ) {
        self.expiry = expiry
        self.isEmpty = isEmpty
        self.retry = retry
        self.timeout = timeout.flatMap { $0 > .zero ? $0 : nil }
        self.staleWhileRevalidate = staleWhileRevalidate
        self.refreshInterval = refreshInterval.flatMap { $0 > .zero ? $0 : nil }
    }
}
