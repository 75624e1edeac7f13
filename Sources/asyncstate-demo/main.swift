// asyncstate-demo: a small Linux service built with @AsyncState, against real local sources.
//
//   swift run asyncstate-demo             # ten seconds of real time, with /proc/loadavg
//   swift run asyncstate-demo --virtual   # the same scenario on a VirtualClock: instant, deterministic

import DemoService
import Foundation
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

let usage = """
    usage: asyncstate-demo [--virtual]

    Runs a small service that holds three values with @AsyncState and prints a timeline of their
    phases: /proc/loadavg (fresh for 1.5 s), a settings file that another task rewrites (invalidated
    when it changes), and a slow upstream that fails now and then (retried with backoff); and it
    walks a paginated audit log twice with @AsyncPagedState (read once, then kept).

      --virtual   run the same scenario on a VirtualClock: instant, and the same output every time
                  (the load averages are recorded lines instead of the host's)
      -h, --help  show this message
    """

/// Prints timeline lines, and a live status line below them when standard output is a terminal.
final class Terminal: Sendable {
    private let status = Mutex<String?>(nil)
    let isInteractive: Bool

    init(isInteractive: Bool) {
        self.isInteractive = isInteractive
    }

    func print(_ line: String) {
        status.withLock { status in
            write(isInteractive ? "\r\u{1B}[2K\(line)\n\(status ?? "")" : "\(line)\n")
        }
    }

    func showStatus(_ text: String?) {
        guard isInteractive else { return }
        status.withLock { status in
            guard status != text else { return }
            status = text
            write("\r\u{1B}[2K\(text ?? "")")
        }
    }

    private func write(_ text: String) {
        FileHandle.standardOutput.write(Data(text.utf8))
    }
}

func runDemo(virtual: Bool) async throws {
    let directory = FileManager.default.temporaryDirectory
        .appendingPathComponent("asyncstate-demo-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(at: directory) }

    let terminal = Terminal(isInteractive: !virtual && isatty(STDOUT_FILENO) != 0)
    let header = "    time  date (UTC)               state     phase"
    let summary: ScenarioSummary
    if virtual {
        terminal.print("asyncstate-demo: the scenario on a VirtualClock (recorded load averages)\n")
        terminal.print(header)
        summary = try await Scenario.runInVirtualTime(directory: directory) { terminal.print($0.rendered) }
    } else {
        let clock = ContinuousClock()
        let scenario = Scenario(clock: clock, loadSource: .proc(), directory: directory)
        terminal.print("asyncstate-demo: ten seconds of a service on the real clock (settings in \(directory.path))\n")
        terminal.print(header)
        let progress = Task {
            let spinner = Array("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏")
            var frame = 0
            while !Task.isCancelled {
                terminal.showStatus(scenario.monitor.loadingSummary().map { "\(spinner[frame % spinner.count]) \($0)" })
                frame += 1
                try? await clock.sleep(for: .milliseconds(80))
            }
            terminal.showStatus(nil)
        }
        defer { progress.cancel() }
        summary = try await scenario.run(clock: clock, date: Date.init, onEntry: { terminal.print($0.rendered) })
        progress.cancel()
        await progress.value
    }
    terminal.print("")
    for line in summary.lines { terminal.print(line) }
}

let arguments = CommandLine.arguments.dropFirst()
if arguments.contains("-h") || arguments.contains("--help") {
    print(usage)
    exit(0)
}
guard arguments.allSatisfy({ $0 == "--virtual" }) else {
    let unknown = arguments.first { $0 != "--virtual" } ?? ""
    FileHandle.standardError.write(Data("asyncstate-demo: unknown argument '\(unknown)'\n\n\(usage)\n".utf8))
    exit(64)  // EX_USAGE
}
do {
    try await runDemo(virtual: arguments.contains("--virtual"))
} catch {
    FileHandle.standardError.write(Data("asyncstate-demo: \(error)\n".utf8))
    exit(1)
}
