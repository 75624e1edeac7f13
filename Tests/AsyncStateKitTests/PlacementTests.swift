// Exercises the "Put it where it fits" types of the article "Getting started" (DocumentationExamples/Placement.swift).
import AsyncStateKit
import AsyncStateTesting
import Testing

@Suite struct PlacementTests {
    static func cities(_ forecasts: [Forecast]) -> [String] { forecasts.map(\.city) }

    @Test func inAStructCopiesShareOneState() async throws {
        let service = WeatherService()
        let copy = service
        _ = try await service.$forecasts.value { try await loadForecasts() }
        #expect(Self.cities(copy.forecasts) == ["Oslo"])
        #expect(copy.$forecasts.phase.name == "success")
    }

    @Test func inAnActor() async throws {
        let cache = WeatherCache()
        _ = try await cache.$forecasts.value { try await loadForecasts() }
        #expect(Self.cities(await cache.forecasts) == ["Oslo"])
    }

    @MainActor
    @Test func inAGlobalActorClass() async throws {
        let model = WeatherModel()
        await model.$forecasts.refresh { try await loadForecasts() }
        #expect(Self.cities(model.forecasts) == ["Oslo"])
    }

    @Test func asALetInASendableFinalClass() async throws {
        let store = WeatherStore()
        _ = try await store.forecasts.value { try await loadForecasts() }
        #expect(Self.cities(store.forecasts.wrappedValue) == ["Oslo"])
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

@Suite struct QuickStartTests {
    @Test func theQuickStartServiceLoadsOnceAndDescribesItsPhase() async throws {
        let service = ConfigService()
        #expect(service.describe() == "not loaded yet")
        let configs = try await withThrowingTaskGroup(of: Config.self) { group in
            for _ in 0..<50 { group.addTask { try await service.current() } }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(configs.allSatisfy { $0.featureFlags == ["new-checkout": true] })
        #expect(service.describe().hasPrefix("loaded at "))
    }
}

@Suite struct FamilyExampleTests {
    @Test func theProfileServiceHoldsOneStatePerUser() async throws {
        let service = ProfileService()
        #expect(try await service.profile(7) == Profile(id: 7, name: "user 7"))
        let results = await service.profiles([7, 8, 9])
        #expect(try results.mapValues { try $0.get().name } == [7: "user 7", 8: "user 8", 9: "user 9"])
        #expect(await service.profiles.count == 3)
    }
}
