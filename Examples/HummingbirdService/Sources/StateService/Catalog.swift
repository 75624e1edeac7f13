import AsyncStateKit
import Foundation
import Metrics
import Synchronization

/// The service's fetched data: one state per route and a family per path parameter, each configured
/// at run time from ``Settings`` (so they are plain `let`s made in `init`, not `@AsyncState` wrappers
/// with literal arguments).
///
/// - `config`: critical — `/ready` answers 503 until it has a value. Refreshed in the background by
///   ``RefreshService`` (owned by the service group) and refreshed ahead by requests from 80 % of
///   its expiry, so requests never wait at the boundary.
/// - `rates`: stale-while-revalidate: an expired value is served at once while one refetch runs.
/// - `profiles`: a profile per user id, at most `profileCapacity` of them, refreshed ahead; idle ones
///   are dropped after `profileIdleExpiry`. `GET /users/:id` loads a missed profile alone;
///   `GET /profiles/:id` loads it with the other profiles missed within `profileBatchWindow`, in one
///   call of the upstream's batch endpoint (``coalescedProfile(_:)``).
/// - `tenants`: a configuration per tenant, read from a ``TenantStore`` shared by every replica and
///   written through it (`PUT /config/:tenant`). With an invalidation bus, a write through any replica
///   invalidates that tenant on all of them (topic ``tenantsTopic``); `tenantExpiry` bounds how long
///   a replica can serve an old configuration when a message is lost. With a second level (a
///   `PostgresSecondLevel` in the same database), the replicas share each tenant's load: a miss
///   reads the tenant there first, and replicas that miss together cost the store one read
///   (`upstream_tenant_reads_total` counts them).
///
/// Every fetch retries with exponential backoff, times out, and caches its failure for
/// `failureExpiry` (the `Retry-After` of a 503), so a down upstream is not hammered.
public final class Catalog: Sendable {
    public let config: AsyncState<ServiceConfig>
    public let rates: AsyncState<Rates>
    public let profiles: AsyncStateFamily<Int, Profile>
    public let tenants: AsyncStateFamily<String, TenantConfig>
    public let upstream: any Upstream
    public let tenantStore: any TenantStore
    /// Carries tenant invalidations to and from the other replicas; `nil` for a single process.
    public let invalidator: AsyncStateInvalidator?
    /// How long a batch of coalesced profile misses collects ids, and the most it holds.
    let profileBatch: (window: Duration, size: Int)
    /// The upstream's batch calls for coalesced profile misses (`upstream_profile_batches_total`), and
    /// the ids they asked for (`upstream_profile_batch_ids_total`): their ratio is the batches' mean size.
    let profileBatches: Counter
    let profileBatchIDs: Counter
    /// The reads of the tenant store made to load a tenant (`upstream_tenant_reads_total`): what the
    /// fleet costs its source.
    let tenantReads: Counter

    /// Why the tenant store is not usable, from the last readiness probe (`nil`: it answered, or
    /// it has not been probed yet).
    private let storeProblem = Mutex<String?>(nil)

    /// The invalidation topic of ``tenants`` (a message's key is the tenant id).
    public static let tenantsTopic = "tenants"

    /// The states' names, as the observers label them.
    public static let stateNames = ["config", "rates", "profiles", "tenants"]

    /// Makes the states; they fetch nothing until asked.
    ///
    /// - Parameters:
    ///   - clock: The states' clock: `ContinuousClock` in production, a `VirtualClock` in tests.
    ///   - observer: Receives every state's events (logs and metrics).
    ///   - tenantStore: Where tenants' configurations live (shared by the replicas).
    ///   - bus: The invalidation bus between replicas; the caller runs the ``invalidator``.
    ///   - authenticator: Signs and checks the invalidations on `bus` (see `HMACAuthenticator`).
    ///   - secondLevel: Where the replicas share the tenants they load (namespace ``tenantsTopic``);
    ///     `nil`: each replica loads its own.
    ///   - entryAuthenticator: Seals the tenants' second-level entries and checks those read (see
    ///     `HMACAuthenticator`): an entry planted without the secret is never served.
    ///   - metrics: Where the upstream's batch calls and the tenant store's reads are counted (the
    ///     bootstrapped factory by default).
    ///   - invalidationMetadata: What each published invalidation carries for the other replicas'
    ///     observers: the writing request's trace context (`TracingObserver/invalidationMetadata()`).
    public init(
        settings: Settings, upstream: any Upstream, clock: some Clock<Duration> = ContinuousClock(),
        observer: (any AsyncStateObserver)? = nil, tenantStore: any TenantStore = InMemoryTenantStore(),
        bus: (any AsyncStateInvalidationBus)? = nil, authenticator: (any AsyncStateInvalidationAuthenticator)? = nil,
        secondLevel: (any AsyncStateSecondLevel)? = nil,
        entryAuthenticator: (any AsyncStateEntryAuthenticator)? = nil,
        metrics: any MetricsFactory = MetricsSystem.factory,
        invalidationMetadata: (@Sendable () -> [String: String])? = nil,
        invalidatorEvents: (@Sendable (AsyncStateInvalidator.Event) -> Void)? = nil
    ) {
        profileBatch = (settings.profileBatchWindow, settings.profileBatchSize)
        profileBatches = Counter(label: "upstream_profile_batches_total", factory: metrics)
        profileBatchIDs = Counter(label: "upstream_profile_batch_ids_total", factory: metrics)
        tenantReads = Counter(label: "upstream_tenant_reads_total", factory: metrics)
        let retry = RetryPolicy.exponential(
            maxAttempts: settings.retryAttempts, initial: settings.retryInitialDelay, cap: .seconds(10),
            jitter: .full
        )
        .retrying { ($0 as? UpstreamError) != .notFound }
        self.upstream = upstream
        self.tenantStore = BoundedTenantStore(tenantStore, timeout: settings.storeTimeout)
        config = AsyncState(
            wrappedValue: ServiceConfig(version: 0, features: [:]), expiry: settings.configExpiry, clock: clock,
            retry: retry, timeout: settings.fetchTimeout, softTimeout: settings.softTimeout,
            failureExpiry: settings.failureExpiry,
            refreshAfter: settings.configExpiry * 0.8, maxStaleAge: settings.maxStaleAge, name: "config",
            observer: observer)
        rates = AsyncState(
            wrappedValue: Rates(base: "", rates: [:]), expiry: settings.ratesExpiry, clock: clock, retry: retry,
            timeout: settings.fetchTimeout, softTimeout: settings.softTimeout, failureExpiry: settings.failureExpiry,
            staleWhileRevalidate: true,
            maxStaleAge: settings.maxStaleAge, name: "rates", observer: observer)
        profiles = AsyncStateFamily(
            expiry: settings.profileExpiry, capacity: settings.profileCapacity,
            idleExpiry: settings.profileIdleExpiry, clock: clock, retry: retry, timeout: settings.fetchTimeout,
            softTimeout: settings.softTimeout,
            failureExpiry: settings.failureExpiry, refreshAfter: settings.profileExpiry * 0.8,
            maxStaleAge: settings.maxStaleAge, name: "profiles", observer: observer)
        // Bounded by count and by weight: tenants are written by clients (each capped by the write
        // route), and cached by whoever asks for them.
        tenants = AsyncStateFamily(
            expiry: settings.tenantExpiry, capacity: settings.profileCapacity,
            maximumWeight: settings.tenantMaximumBytes, weigher: { _, config in config.weight }, clock: clock,
            retry: retry, timeout: settings.fetchTimeout, softTimeout: settings.softTimeout,
            failureExpiry: settings.failureExpiry,
            maxStaleAge: settings.maxStaleAge, tags: { _, config in config.tags }, name: "tenants", observer: observer,
            secondLevel: secondLevel.map {
                AsyncStateSecondLevelOptions(
                    level: $0, namespace: Self.tenantsTopic, codec: .json(tag: "TenantConfig"),
                    timeout: settings.secondLevelTimeout,
                    writesInBackground: settings.secondLevelWritesInBackground, authenticator: entryAuthenticator)
            })
        invalidator = bus.map {
            AsyncStateInvalidator(
                bus: $0, authenticator: authenticator, invalidateAllInterval: settings.invalidateAllInterval,
                clock: clock, metadata: invalidationMetadata, events: invalidatorEvents)
        }
        invalidator?.subscribe(tenants, to: Self.tenantsTopic)
    }

    /// Whether every critical state has a value (fetched once; it may have expired since) and the
    /// tenant store answered the last probe: what `/ready` reports.
    public var isReady: Bool { notReadyReason == nil }

    /// Why the service is not ready, for `/ready`'s body: `nil` when it is.
    public var notReadyReason: String? {
        if let problem = storeProblem.withLock({ $0 }) { return problem }
        return config.snapshot.hasValue ? nil : "the configuration has not loaded yet"
    }

    /// Asks the tenant store whether it answers (within the store timeout), and keeps the reason
    /// if it does not; returns it.
    @discardableResult
    public func probeStore() async -> String? {
        var problem: String?
        do {
            try await tenantStore.probe()
        } catch is CancellationError {
            return storeProblem.withLock { $0 }
        } catch {
            problem = "\(error)"
        }
        storeProblem.withLock { $0 = problem }
        return problem
    }

    // MARK: Warm restarts

    /// What the service saves on shutdown and loads at start.
    public struct Saved: Codable, Sendable {
        public var config: AsyncStateArchive<ServiceConfig>?
        public var rates: AsyncStateArchive<Rates>?
        public var profiles: [Int: AsyncStateArchive<Profile>]
        /// Absent from files saved before tenants existed.
        public var tenants: [String: AsyncStateArchive<TenantConfig>]?
    }

    /// The states' data, for ``save(to:)``.
    public var saved: Saved {
        Saved(config: config.archive, rates: rates.archive, profiles: profiles.archive, tenants: tenants.archive)
    }

    /// Saves the states' data to `file` (atomically: a crash mid-save leaves the previous file).
    public func save(to file: AsyncStateArchiveFile) throws {
        try file.save(saved)
    }

    /// Loads what ``save(to:)`` saved, as stale data: the configuration is due for its refresh
    /// ahead, the rates are served stale while they refetch, profiles are refetched ahead too, and
    /// tenants are refetched before they are served (a tenant may have changed while this process
    /// was down).
    ///
    /// - Returns: How many states and profiles were restored; 0 without a file.
    /// - Throws: ``AsyncStateArchiveError`` for a file that cannot be used (start cold then).
    @discardableResult
    public func restore(from file: AsyncStateArchiveFile) async throws -> Int {
        guard let saved = try file.load(Saved.self) else { return 0 }
        var restored = 0
        if let archive = saved.config, try await config.restore(archive) { restored += 1 }
        if let archive = saved.rates, try await rates.restore(archive) { restored += 1 }
        restored += try profiles.restore(saved.profiles)
        restored += try tenants.restore(saved.tenants ?? [:])
        return restored
    }

    // The operations: each fetch goes through the states, never straight to the upstream. Each passes
    // what it needs as a context to an operation that captures nothing, so that a fresh answer
    // allocates no closure (`snapshot(using:)`).

    func configSnapshot() async throws -> AsyncSnapshot<ServiceConfig> {
        try await config.snapshot(using: upstream) { try await $0.config() }
    }

    func ratesSnapshot() async throws -> AsyncSnapshot<Rates> {
        try await rates.snapshot(using: upstream) { try await $0.rates() }
    }

    func profileSnapshot(_ id: Int) async throws -> AsyncSnapshot<Profile?> {
        try await profiles.snapshot(for: id, using: upstream) { id, upstream in try await upstream.profile(id) }
    }

    /// User `id`'s profile from the same family, a miss loaded in a batch with the other ids missed
    /// within the batch window (one call of ``Upstream/profiles(_:)`` per batch); a fresh profile is
    /// answered at once. Throws ``AsyncStateKit/AsyncStateError/missingFromBatch`` for an unknown id.
    func coalescedProfile(_ id: Int) async throws -> Profile {
        try await profiles.value(for: id, batchWindow: profileBatch.window, maxBatchSize: profileBatch.size) {
            [self] ids in
            profileBatches.increment()
            profileBatchIDs.increment(by: ids.count)
            return try await upstream.profiles(ids)
        }
    }

    func tenantSnapshot(_ id: String) async throws -> AsyncSnapshot<TenantConfig?> {
        try await tenants.snapshot(for: id, using: self) { id, catalog in
            catalog.tenantReads.increment()
            return try await catalog.tenantStore.tenant(id)
        }
    }

    /// How a write reached the other replicas.
    public enum Announcement: String, Sendable {
        /// Published on the bus (and marked in the second level, if there is one).
        case published
        /// The bus (or the second level) could not take it: the invalidator keeps it and sends it
        /// again until it does (see `AsyncStateInvalidator.Recovery`).
        case queued
        /// The bus could not publish and the invalidator keeps nothing (no recovery): other replicas
        /// learn of the write when their bus reconnects, or when their copy expires.
        case failed
        /// No bus: a single process.
        case local
    }

    /// Invalidates every cached tenant carrying `tag` (``TenantConfig/tags``: `plan:<name>` for a
    /// tenant whose `plan` setting names one) here and, through the bus, on every other replica: after
    /// a change to what a plan includes, which every tenant on it reads.
    ///
    /// Returns whether the bus carried the message; the observer counts the entries.
    public func invalidateTenants(tag: String) async -> Announcement {
        await announce(
            locally: { $0.invalidate(tag: tag) }, through: { try await $0.invalidate(Self.tenantsTopic, tag: tag) })
    }

    /// Invalidates tenants here with `locally` when there is no bus; otherwise through the
    /// invalidator with `through`, which invalidates here at once and publishes, and says whether the
    /// bus carried the message.
    private func announce(
        locally: (AsyncStateFamily<String, TenantConfig>) -> Void,
        through: (AsyncStateInvalidator) async throws -> AsyncStateInvalidator.Outcome
    ) async -> Announcement {
        guard let invalidator else {
            locally(tenants)
            return .local
        }
        do {
            switch try await through(invalidator) {
            case .published: return .published
            case .queued: return .queued
            }
        } catch {
            return .failed
        }
    }

    /// Writes `settings` for tenant `id` to the store, then writes the new configuration here, in
    /// the second level (with a new version) and, through the bus, announces it to every other
    /// replica, which takes it from the second level without reading the store
    /// (`AsyncStateInvalidator.set(_:for:in:topic:)`). Without a second level the others read the
    /// store once each; without a bus it is written here only.
    ///
    /// - Throws: The store's error; nothing was written then.
    public func writeTenant(_ id: String, settings: [String: String]) async throws -> (
        TenantConfig, Announcement
    ) {
        let config = try await tenantStore.write(id, settings: settings)
        let announcement = await announce(
            locally: { $0.set(config, for: id) },
            through: { [tenants] in try await $0.set(config, for: id, in: tenants, topic: Self.tenantsTopic) })
        return (config, announcement)
    }
}
