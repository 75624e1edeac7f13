import AsyncStateKit
import AsyncStateTesting
import Foundation
import HTTPTypes
import Hummingbird
import HummingbirdTesting
import Testing

@testable import StateService

@Suite struct RouteTests {
    @Test func statusAndHeadersFollowThePhaseOfEachState() async throws {
        let fixture = Fixture()
        let (clock, upstream) = (fixture.clock, fixture.upstream)
        try await fixture.routes().test(.router) { client async throws in
            // Fetched: 200, fresh, Age 0.
            var response = try await client.get("/config")
            #expect(response.status == .ok)
            #expect(response.phase == "success")
            #expect(response.headers[.age] == "0")
            #expect(response.text.contains("\"version\":1"))

            // Half a minute later: the same data, from the state, 30 s old.
            await clock.advance(by: .seconds(30))
            response = try await client.get("/config")
            #expect(response.status == .ok)
            #expect(response.headers[.age] == "30")
            #expect(upstream.calls("config") == 1)

            // Expired, and the upstream is down: the last good value, with its age and the phase.
            upstream.setDown(true)
            await clock.advance(by: .seconds(31))
            response = try await client.get("/config")
            #expect(response.status == .ok)
            #expect(response.phase == "failure")
            #expect(response.headers[.age] == "61")
            #expect(upstream.calls("config") == 2)

            // Never fetched and the upstream is down: 503 with Retry-After (the failure expiry);
            // within it, the cached failure is answered without calling the upstream again.
            response = try await client.get("/rates")
            #expect(response.status == .serviceUnavailable)
            #expect(response.headers[.retryAfter] == "1")
            #expect(response.phase == "failure")
            #expect(try await client.get("/rates").status == .serviceUnavailable)
            #expect(upstream.calls("rates") == 1)

            // Back up, after the failure expiry: 200.
            upstream.setDown(false)
            await clock.advance(by: .seconds(1))
            #expect(try await client.get("/rates").status == .ok)
            #expect(upstream.calls("rates") == 2)

            // A path parameter that is not an id, and an id the upstream does not know.
            #expect(try await client.get("/users/abc").status == .badRequest)
            response = try await client.get("/users/2000000")
            #expect(response.status == .notFound)
            #expect(try await client.get("/users/42").text.contains("user 42"))
        }
    }

    @Test func concurrentRequestsShareOneRunPerKeyAndTheMetricsSaySo() async throws {
        let fixture = Fixture(latency: .seconds(1))
        let (clock, upstream) = (fixture.clock, fixture.upstream)
        try await fixture.routes().test(.router) { client async throws in
            try await withThrowingTaskGroup(of: TestResponse.self) { group in
                for _ in 0..<20 { group.addTask { try await client.get("/users/7") } }
                for _ in 0..<10 { group.addTask { try await client.get("/config") } }
                // Every request has joined (or started) its state's fetch — the handlers run on
                // threads the clock does not watch, so wait for the metrics to say so — and one
                // upstream call per state is asleep for its second (four sleepers: the two calls and
                // their attempts' timeout timers, which alone would make two).
                #expect(
                    await eventually {
                        fixture.metric(#"async_state_misses_total{state="profiles"}"#) == 20
                            && fixture.metric(#"async_state_misses_total{state="config"}"#) == 10
                    })
                await clock.waitForSleepers(4)
                await clock.advance(by: .seconds(1))
                for try await response in group { #expect(response.status == .ok) }
            }
            #expect(upstream.calls("profile") == 1)
            #expect(upstream.calls("config") == 1)
            for _ in 0..<5 { #expect(try await client.get("/users/7").status == .ok) }
        }
        #expect(fixture.metric(#"async_state_runs_total{state="profiles",reason="fetch"}"#) == 1)
        #expect(fixture.metric(#"async_state_misses_total{state="profiles"}"#) == 20)
        #expect(fixture.metric(#"async_state_hits_total{state="profiles"}"#) == 5)
        #expect(fixture.metric(#"async_state_runs_total{state="config",reason="fetch"}"#) == 1)
        #expect(fixture.metric(#"async_state_misses_total{state="config"}"#) == 10)
        #expect(fixture.metric(#"async_state_fetch_duration_seconds_count{state="config",outcome="success"}"#) == 1)
        #expect(fixture.metric(#"async_state_fetch_duration_seconds_sum{state="config",outcome="success"}"#) == 1)
    }

    @Test func failuresAndEvictionsAreCounted() async throws {
        let fixture = Fixture { $0.profileCapacity = 2 }
        try await fixture.routes().test(.router) { client async throws in
            for id in 1...5 { #expect(try await client.get("/users/\(id)").status == .ok) }
            fixture.upstream.setDown(true)
            #expect(try await client.get("/rates").status == .serviceUnavailable)
        }
        #expect(fixture.metric(#"async_state_evictions_total{state="profiles",reason="evicted"}"#) == 3)
        #expect(fixture.metric(#"async_state_failures_total{state="rates"}"#) == 1)
        #expect(fixture.metric(#"async_state_fetch_duration_seconds_count{state="rates",outcome="failure"}"#) == 1)
    }

    @Test func aStaleServeIsCountedApartFromHits() async throws {
        let fixture = Fixture()
        let clock = fixture.clock
        try await fixture.routes().test(.router) { client async throws in
            #expect(try await client.get("/rates").status == .ok)  // a miss: fetched
            #expect(try await client.get("/rates").status == .ok)  // a hit
            await clock.advance(by: .seconds(6))  // past the rates' 5 s expiry
            #expect(try await client.get("/rates").status == .ok)  // stale, at once, refreshed behind it
            await clock.advance(by: .zero)
        }
        #expect(fixture.metric(#"async_state_hits_total{state="rates"}"#) == 1)
        #expect(fixture.metric(#"async_state_stale_serves_total{state="rates"}"#) == 1)
        #expect(fixture.metric(#"async_state_misses_total{state="rates"}"#) == 1)
        #expect(fixture.metric(#"async_state_runs_total{state="rates",reason="background"}"#) == 1)
    }

    @Test func failSafeAnswersACoalescedProfileWhileTheUpstreamIsDownAndCountsIt() async throws {
        let fixture = Fixture { $0.maxStaleAge = .seconds(60) }
        let clock = fixture.clock
        try await fixture.routes().test(.router) { client async throws in
            let first = try await getAll(["/profiles/7"], from: client, advancing: clock)
            #expect(first.map(\.status) == [.ok])
            fixture.upstream.setDown(true)
            await clock.advance(by: fixture.settings.profileExpiry)  // expired: the next read fetches
            let stale = try await getAll(["/profiles/7"], from: client, advancing: clock)
            #expect(stale.map(\.status) == [.ok])
            // The same profile (compared decoded: the encoder's key order is not fixed).
            let decode = { (response: TestResponse?) in
                response.flatMap { try? JSONDecoder().decode(Profile.self, from: Data($0.text.utf8)) }
            }
            #expect(decode(stale.first) == Profile(id: 7, name: "user 7"))
            #expect(decode(stale.first) == decode(first.first))
            await clock.advance(by: .seconds(30))  // 60 s old: as old as the maximum
            await clock.advance(by: fixture.settings.failureExpiry)
            let failed = try await getAll(["/profiles/7"], from: client, advancing: clock)
            #expect(failed.map(\.status) == [.serviceUnavailable])
        }
        #expect(fixture.metric(#"async_state_fail_safe_serves_total{state="profiles"}"#) == 1)
        #expect(fixture.metric(#"async_state_failures_total{state="profiles"}"#) == 2)
    }

    @Test func aSoftTimeoutAnswersASlowUpstreamWithTheHeldProfileAndItsLateAnswerLands() async throws {
        let fixture = Fixture(latency: .seconds(3)) {
            $0.softTimeout = .seconds(1)
            $0.fetchTimeout = .seconds(10)
        }
        let clock = fixture.clock
        try await fixture.routes().test(.router) { client async throws in
            #expect(try await getAll(["/profiles/7"], from: client, advancing: clock).map(\.status) == [.ok])
            await clock.advance(by: fixture.settings.profileExpiry)  // expired
            let start = clock.now
            let held = try await getAll(["/profiles/7"], from: client, advancing: clock)
            #expect(held.map(\.status) == [.ok])
            #expect(start.duration(to: clock.now) < .seconds(2))  // answered at the soft timeout
            await clock.advance(by: .seconds(3))  // the upstream's late answer lands
            #expect(fixture.upstream.calls("profiles") == 2)
        }
        #expect(fixture.metric(#"async_state_soft_timeouts_total{state="profiles"}"#) == 1)
        #expect(fixture.metric(#"async_state_fetch_duration_seconds_count{state="profiles",outcome="success"}"#) == 2)
    }

    @Test func theMetricsEndpointServesTheRegistry() async throws {
        let fixture = Fixture()
        try await fixture.routes().test(.router) { client async throws in
            _ = try await client.get("/config")
            _ = try await client.get("/config")
            let response = try await client.get("/metrics")
            #expect(response.status == .ok)
            #expect(response.text.contains(#"async_state_hits_total{state="config"} 1"#))
            #expect(response.text.contains(#"async_state_runs_total{state="config",reason="fetch"} 1"#))
        }
    }

    @Test func coalescedProfileMissesShareBatchCalls() async throws {
        // A window of an hour: a batch closes only when it holds 100 ids, whatever the threads do.
        let fixture = Fixture(latency: .seconds(1)) {
            $0.profileBatchWindow = .seconds(3_600)
            $0.fetchTimeout = .seconds(3_600)
        }
        let (clock, upstream) = (fixture.clock, fixture.upstream)
        try await fixture.routes().test(.router) { client async throws in
            // 200 distinct ids (one unknown), and 20 more requests for ids already asked.
            let ids = Array(0..<199) + [2_000_000] + Array(0..<20)
            let responses = try await getAll(ids.map { "/profiles/\($0)" }, from: client, advancing: clock)
            for (id, response) in zip(ids, responses) {
                if id == 2_000_000 {
                    #expect(response.status == .notFound)
                } else {
                    #expect(response.status == .ok)
                    #expect(response.text.contains("user \(id)"))
                }
            }
            #expect(upstream.calls("profiles") == 2)
            #expect(upstream.batchSizes == [100, 100])
            #expect(upstream.calls("profile") == 0)
            // Fresh now: answered at once, with no call.
            #expect(try await client.get("/profiles/7").status == .ok)
            #expect(upstream.calls("profiles") == 2)
        }
        #expect(fixture.metric("upstream_profile_batches_total") == 2)
        #expect(fixture.metric("upstream_profile_batch_ids_total") == 200)
    }

    @Test func aLoneCoalescedMissIsLoadedWhenTheWindowEndsAndAFailureIs503() async throws {
        let fixture = Fixture(latency: .seconds(1)) {
            $0.profileBatchWindow = .milliseconds(2)
            $0.fetchTimeout = .seconds(3_600)
        }
        let (clock, upstream) = (fixture.clock, fixture.upstream)
        try await fixture.routes().test(.router) { client async throws in
            for (id, down, status) in [(5, false, HTTPResponse.Status.ok), (6, true, .serviceUnavailable)] {
                upstream.setDown(down)
                let answer = try await getAll(["/profiles/\(id)"], from: client, advancing: clock)[0]
                #expect(answer.status == status)
                if down { #expect(answer.headers[.retryAfter] == "1") }
            }
            #expect(upstream.batchSizes == [1, 1])
            #expect(try await client.get("/profiles/abc").status == .badRequest)
        }
    }
}
