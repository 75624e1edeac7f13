import Foundation
import InMemoryTracing
import ServiceLifecycle
import Synchronization
import Tracing

/// Records the service's spans with swift-distributed-tracing's in-memory tracer and writes them to
/// a file as JSON lines, one finished span a line (`TRACE_FILE`): a trace to read without a
/// collector, as CI does under `wrk`. A production service bootstraps an exporter (swift-otel)
/// instead; the spans are the same.
///
/// Each line: `name`, `trace`, `span`, `parent` (absent for a root), `start_ns` and `end_ns` (since
/// the epoch), `attributes`, `links` (`trace` and `span` of each), `events` (`name`, `attributes`),
/// `errors` (their descriptions).
public final class TraceExport: Service {
    /// The tracer to bootstrap (`InstrumentationSystem.bootstrap(export.tracer)`). Its ids start with
    /// a prefix drawn for this process (`3fa9c1-span-12`), so that the traces of several replicas,
    /// which link to each other, can be read together.
    public let tracer = InMemoryTracer(
        idGenerator: TraceExport.processUniqueIDs(), recordInjections: false, recordExtractions: false)
    private let file: FileHandle
    private let interval: Duration

    /// Writes to `path`, every `interval` while it runs and once more when it stops. The file is
    /// the owner's alone (mode 0600: spans carry tenants' ids and request details); a symbolic
    /// link, a file that is not regular or one another user owns is refused, never followed or
    /// truncated; this process's own previous trace there is truncated.
    ///
    /// - Throws: When the file cannot be opened so.
    public init(path: String, interval: Duration = .milliseconds(200)) throws {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: path, "errno": errno])
        }
        var status = stat()
        guard fstat(descriptor, &status) == 0, status.st_mode & S_IFMT == S_IFREG, status.st_uid == geteuid(),
            fchmod(descriptor, 0o600) == 0, ftruncate(descriptor, 0) == 0
        else {
            close(descriptor)
            throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: path])
        }
        file = FileHandle(fileDescriptor: descriptor, closeOnDealloc: true)
        self.interval = interval
    }

    /// Trace and span ids `PREFIX-trace-N` and `PREFIX-span-N`, with a prefix of six hexadecimal
    /// digits drawn once.
    static func processUniqueIDs() -> InMemoryTracer.IDGenerator {
        let prefix = String(UInt32.random(in: 0...0xFF_FFFF), radix: 16)
        let counters = Counters()
        return InMemoryTracer.IDGenerator(
            nextTraceID: { "\(prefix)-trace-\(counters.traces.add(1, ordering: .relaxed).newValue)" },
            nextSpanID: { "\(prefix)-span-\(counters.spans.add(1, ordering: .relaxed).newValue)" })
    }

    /// The id generator's counters, shared by its closures.
    private final class Counters: Sendable {
        let traces = Atomic(0)
        let spans = Atomic(0)
    }

    /// Writes the spans that finished since the last call; returns how many.
    @discardableResult
    public func flush() -> Int {
        let spans = tracer.popFinishedSpans()
        guard !spans.isEmpty else { return 0 }
        var lines = Data()
        for span in spans {
            guard let line = try? JSONSerialization.data(withJSONObject: Self.object(span), options: [.sortedKeys])
            else { continue }
            lines.append(line)
            lines.append(0x0A)
        }
        file.write(lines)
        return spans.count
    }

    /// Flushes every `interval` until graceful shutdown, then once more.
    public func run() async throws {
        await cancelWhenGracefulShutdown { [self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: interval)
                flush()
            }
        }
        flush()
    }

    /// A span as a JSON object.
    static func object(_ span: FinishedInMemorySpan) -> [String: Any] {
        var object: [String: Any] = [
            "name": span.operationName, "trace": span.traceID, "span": span.spanID,
            "start_ns": span.startInstant.nanosecondsSinceEpoch, "end_ns": span.endInstant.nanosecondsSinceEpoch,
            "attributes": json(span.attributes),
            "links": span.links.compactMap { link -> [String: String]? in
                guard let target = link.context.inMemorySpanContext else { return nil }
                return ["trace": target.traceID, "span": target.spanID]
            },
            "events": span.events.map { ["name": $0.name, "attributes": json($0.attributes)] },
            "errors": span.errors.map { "\($0.error)" },
        ]
        if let parent = span.parentSpanID { object["parent"] = parent }
        return object
    }

    private static func json(_ attributes: SpanAttributes) -> [String: Any] {
        var object: [String: Any] = [:]
        // `SpanAttributes` is no `Sequence`: `forEach` is its only way through.
        // swift-format-ignore: ReplaceForEachWithForLoop
        attributes.forEach { name, value in
            switch value {
            case .int32(let number): object[name] = number
            case .int64(let number): object[name] = number
            case .double(let number): object[name] = number
            case .bool(let flag): object[name] = flag
            case .string(let text): object[name] = text
            case .stringArray(let texts): object[name] = texts
            case .int32Array(let numbers): object[name] = numbers
            case .int64Array(let numbers): object[name] = numbers
            case .doubleArray(let numbers): object[name] = numbers
            case .boolArray(let flags): object[name] = flags
            default: object[name] = "\(value)"
            }
        }
        return object
    }
}
