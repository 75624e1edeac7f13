// The README's "Where it can live" examples, compiled and exercised.
import AsyncStateKit
import AsyncStateTesting
import Testing

struct Forecast: Sendable, Equatable {
    var city: String
    var celsius: Int
}

func loadForecasts() async throws -> [Forecast] {
    [Forecast(city: "Oslo", celsius: -3)]
}

// 1. In a struct: copies share one state.
struct WeatherService {
    @AsyncState var forecasts: [Forecast] = []

    func current() async throws -> [Forecast] {
        try await $forecasts.value { try await loadForecasts() }
    }
}

// 2. In an actor.
actor WeatherCache {
    @AsyncState(expiry: .seconds(60)) var forecasts: [Forecast] = []

    func current() async throws -> [Forecast] {
        try await $forecasts.value { try await loadForecasts() }
    }
}

// 3. In a global-actor-isolated class.
@MainActor
final class WeatherModel {
    @AsyncState var forecasts: [Forecast] = []

    func reload() async {
        await $forecasts.refresh { try await loadForecasts() }
    }
}

// 4. In a Sendable final class: a `let`, not a wrapped `var`.
final class WeatherStore: Sendable {
    let forecasts = AsyncState<[Forecast]>(wrappedValue: [])

    func current() async throws -> [Forecast] {
        try await forecasts.value { try await loadForecasts() }
    }
}

@Suite struct PlacementTests {
    static let oslo = [Forecast(city: "Oslo", celsius: -3)]

    @Test func inAStructCopiesShareOneState() async throws {
        let service = WeatherService()
        let copy = service
        #expect(try await service.current() == Self.oslo)
        #expect(copy.forecasts == Self.oslo)
        #expect(copy.$forecasts.phase.name == "success")
    }

    @Test func inAnActor() async throws {
        let cache = WeatherCache()
        #expect(try await cache.current() == Self.oslo)
        #expect(await cache.forecasts == Self.oslo)
    }

    @MainActor
    @Test func inAGlobalActorClass() async throws {
        let model = WeatherModel()
        await model.reload()
        #expect(model.forecasts == Self.oslo)
    }

    @Test func asALetInASendableFinalClass() async throws {
        let store = WeatherStore()
        #expect(try await store.current() == Self.oslo)
        #expect(store.forecasts.wrappedValue == Self.oslo)
    }

    @Test func inAStructWithAVirtualClock() async throws {
        struct Service {
            @AsyncState var forecasts: [Forecast]
            init(clock: VirtualClock) {
                _forecasts = AsyncState(wrappedValue: [], expiry: .seconds(60), clock: clock)
            }
        }
        let clock = VirtualClock()
        let service = Service(clock: clock)
        let runs = LockedValue(0)
        let load: @Sendable () async throws -> [Forecast] = {
            runs.withLock { $0 += 1 }
            return try await loadForecasts()
        }
        _ = try await service.$forecasts.value(load)
        await clock.advance(by: .seconds(60))
        _ = try await service.$forecasts.value(load)
        #expect(runs.withLock { $0 } == 2)
    }
}
