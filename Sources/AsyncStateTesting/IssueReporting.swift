import Foundation

#if canImport(Testing)
import Testing
#endif

/// Reports a test failure at `location`: as a Swift Testing issue when a test is running, and on
/// standard error in any case (so an XCTest run or a command-line run shows it too).
func reportIssue(_ message: String, at location: VirtualClock.SourceLocation) {
    #if canImport(Testing)
    if Test.current != nil {
        Issue.record(
            Comment(rawValue: message),
            sourceLocation: Testing.SourceLocation(
                fileID: location.fileID, filePath: location.filePath, line: location.line,
                column: location.column))
    }
    #endif
    FileHandle.standardError.write(Data((message + "\n").utf8))
}
