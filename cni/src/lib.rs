//! The CNI plugin and node agent: in-pod redirection and the ZDS peer. Built in issue 4.
