//! The node proxy (`ztunnel`): outbound capture, HBONE tunnel, inbound authorization. Built in issue 3.
