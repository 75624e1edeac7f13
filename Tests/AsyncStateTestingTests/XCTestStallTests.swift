import AsyncStateTesting
import XCTest

/// A stall reported by a `VirtualClock` fails an XCTest test too, not only a Swift Testing one.
final class XCTestStallTests: XCTestCase {
    /// The stalls this test case recorded, instead of failing the run with them.
    private var recorded: [String] = []

    override func recordFailure(
        withDescription description: String, inFile filePath: String, atLine lineNumber: Int, expected: Bool
    ) {
        guard description.contains("VirtualClock stalled") else {
            // Any other failure (this test's own assertions) fails the test as usual.
            return super.recordFailure(
                withDescription: description, inFile: filePath, atLine: lineNumber, expected: expected)
        }
        recorded.append(description)
    }

    func testAStallIsRecordedAsAnXCTestFailure() async {
        let clock = VirtualClock(startDate: Date(timeIntervalSinceReferenceDate: 0), stallTimeout: .milliseconds(100))
        await clock.waitForSleepers(1)  // nobody will ever sleep: a stall
        XCTAssertEqual(recorded.count, 1)
        XCTAssertTrue(recorded.first?.contains("VirtualClock stalled in waitForSleepers") == true, "\(recorded)")
    }
}
