//! Host memory a pool copies device memory into while it sleeps (see
//! [`crate::Pool::sleep`]): page-locked on a GPU, so the copies run at the bus's speed and the
//! pages cannot be swapped out under the copy; plain heap memory on the simulated device.

use std::fmt;

/// Host memory behind a [`HostBuffer`]: how it is reached and how it is given back.
pub trait HostMemory: Send + Sync {
    /// The bytes.
    fn bytes(&self) -> &[u8];

    /// The bytes, writable.
    fn bytes_mut(&mut self) -> &mut [u8];
}

/// Host memory made by [`crate::driver::Driver::host_buffer`]; given back when dropped.
pub struct HostBuffer(Box<dyn HostMemory>);

impl HostBuffer {
    /// Wraps host memory of any kind.
    pub fn new(memory: Box<dyn HostMemory>) -> Self {
        Self(memory)
    }

    /// Zeroed heap memory (calloc: pages are touched only when written).
    pub fn heap(len: usize) -> Self {
        Self(Box::new(Heap(vec![0u8; len])))
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.0.bytes().len()
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        self.0.bytes_mut()
    }
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len())
            .finish()
    }
}

struct Heap(Vec<u8>);

impl HostMemory for Heap {
    fn bytes(&self) -> &[u8] {
        &self.0
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.0
    }
}
