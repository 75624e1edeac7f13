import Foundation

extension Date {
    /// This date in whole milliseconds since 1970 (to the nearest), clamped to `Int64`; 0 for a date
    /// that is not finite. The one conversion of a wall date to milliseconds: an invalidation's
    /// `sentAt` and its replay window, and the dates a second-level entry's seal covers.
    var millisecondsSince1970: Int64 {
        let milliseconds = (timeIntervalSince1970 * 1_000).rounded()
        guard milliseconds.isFinite else { return 0 }
        return milliseconds >= 9.2e18 ? .max : milliseconds <= -9.2e18 ? .min : Int64(milliseconds)
    }
}
