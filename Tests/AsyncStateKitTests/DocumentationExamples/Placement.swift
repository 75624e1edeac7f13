// swift-format-ignore-file
// Verbatim from README.md and Sources/AsyncStateKit/AsyncStateKit.docc/GettingStarted.md; .ci/doc-snippets
// checks that their blocks still match this file.
import AsyncStateKit

struct Forecast: Sendable { var city: String; var celsius: Int }
func loadForecasts() async throws -> [Forecast] { [Forecast(city: "Oslo", celsius: -3)] }

// In a struct (copies share one state).
struct WeatherService {
    @AsyncState var forecasts: [Forecast] = []
}

// In an actor.
actor WeatherCache {
    @AsyncState(expiry: .seconds(60)) var forecasts: [Forecast] = []
}

// In a global-actor-isolated class.
@MainActor final class WeatherModel {
    @AsyncState var forecasts: [Forecast] = []
}

// In a Sendable final class: a plain `let`.
final class WeatherStore: Sendable {
    let forecasts = AsyncState<[Forecast]>(wrappedValue: [])
}
