extension VirtualClock {
    /// Where in the test a clock call was made.
    public struct SourceLocation: Sendable, Hashable, CustomStringConvertible {
        /// The file ID (`Module/File.swift`) of the call.
        public var fileID: String
        /// The file path of the call.
        public var filePath: String
        /// The line of the call.
        public var line: Int
        /// The column of the call.
        public var column: Int

        /// Creates a source location.
        public init(fileID: String, filePath: String, line: Int, column: Int) {
            self.fileID = fileID
            self.filePath = filePath
            self.line = line
            self.column = column
        }

        /// `fileID:line:column`.
        public var description: String { "\(fileID):\(line):\(column)" }
    }

    /// A wait on a ``VirtualClock`` that could not make progress, reported instead of a hang.
    ///
    /// The default handler records it as a test issue; pass `onStall:` to
    /// ``VirtualClock/init(startDate:stallTimeout:onStall:)`` to handle it yourself.
    public struct Stall: Sendable, CustomStringConvertible {
        /// The clock call that stalled, e.g. `"advance(by: 5.0 seconds)"`.
        public var operation: String
        /// Why it could not go on.
        public var reason: String
        /// The virtual time when it gave up.
        public var now: Instant
        /// The deadlines of the sleepers still pending, soonest first.
        public var pendingSleepers: [Instant]
        /// The jobs queued or running on the clock's executor when it gave up.
        public var runningJobs: Int
        /// Where the call was made.
        public var location: SourceLocation

        /// A readable report: the call, the reason, the time and every pending sleeper.
        public var description: String {
            let sleepers =
                pendingSleepers.isEmpty
                ? "none" : pendingSleepers.map { "\($0)" }.joined(separator: ", ")
            return """
                VirtualClock stalled in \(operation) at \(location): \(reason).
                  now: \(now); jobs queued or running on the clock's executor: \(runningJobs)
                  pending sleepers (\(pendingSleepers.count)): \(sleepers)
                """
        }
    }
}
