//! What one instance of a function takes from wasmtime's instance pool,
//! counted from its bytes before anything is compiled, so that `coord serve`
//! sizes the pool for the function it runs instead of for a guess.
//!
//! A composed function is the function's own core modules, coord's, and the
//! adapters and shims the composition added; a Python function built by
//! componentize-py instantiates 17 core modules per request where the Rust
//! inventory function needs far fewer. The pool has to hold
//! `max_requests` of whatever that is, and a function that does not fit
//! (its first memory larger than an instance may ever have) is refused at
//! start with the numbers, not at its first request.

use coord_host::{MAX_MEMORY_BYTES, PoolSlot};
use wasmparser::{
    CanonicalFunction, ComponentAlias, ComponentExternalKind, ComponentImport, ComponentInstance,
    ComponentOuterAliasKind, ComponentTypeRef, Instance, Parser, Payload,
};

/// wasmtime's default bound on a pooled table's elements; raised for a
/// function whose table starts larger.
const DEFAULT_TABLE_ELEMENTS: u64 = 20_000;

/// What one instance of a component takes from the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Core module instances, counted once per instantiation.
    pub core_instances: u32,
    /// At most how many more core instances wasmtime adds: it compiles the
    /// calls between the composed components (a function lowered from
    /// another component's lift) into adapter modules of its own, one per
    /// group of adapters, which the bytes do not show. Each canonical lower
    /// is at most one adapter, so their count bounds the modules. (Sized
    /// without them, the inventory function's pool for one request served
    /// none.) A core instance slot is a counter, not reserved memory, so
    /// the bound costs nothing.
    pub adapter_instances: u32,
    /// Linear memories the instance defines (imported ones are shared, not
    /// allocated).
    pub memories: u32,
    /// Tables the instance defines.
    pub tables: u32,
    /// The most memories any one core module defines.
    pub memories_per_module: u32,
    /// The most tables any one core module defines.
    pub tables_per_module: u32,
    /// The largest initial size of any memory, in bytes.
    pub largest_memory_bytes: u64,
    /// The largest initial size of any table, in elements.
    pub largest_table_elements: u64,
}

impl Footprint {
    /// Count what one instance of `component` (a component's bytes) takes.
    /// Fails on bytes that do not parse, naming what is wrong.
    pub fn of(component: &[u8]) -> wasmtime::Result<Footprint> {
        count(component).map_err(|e| wasmtime::format_err!("reading the function's modules: {e}"))
    }

    /// The pool slot one instance needs (every table slot as large as the
    /// largest table, and at least wasmtime's default).
    pub(crate) fn slot(&self) -> PoolSlot {
        PoolSlot {
            core_instances: self.core_instances.saturating_add(self.adapter_instances),
            memories: self.memories,
            tables: self.tables,
            memories_per_module: self.memories_per_module,
            tables_per_module: self.tables_per_module,
            table_elements: usize::try_from(
                self.largest_table_elements.max(DEFAULT_TABLE_ELEMENTS),
            )
            .unwrap_or(usize::MAX),
        }
    }

    /// Refuse a function no pool slot can hold, saying which limit and by
    /// how much (a table starting large only makes the slots larger).
    pub fn check(&self) -> wasmtime::Result<()> {
        if self.largest_memory_bytes > MAX_MEMORY_BYTES {
            wasmtime::bail!(
                "the function cannot run here: one of its memories starts at {} MiB, \
                 above the {} MiB an instance's memory may reach",
                self.largest_memory_bytes.div_ceil(1 << 20),
                MAX_MEMORY_BYTES >> 20
            );
        }
        Ok(())
    }
}

/// What instantiating a module or component once costs.
#[derive(Clone, Copy, Debug, Default)]
struct Cost {
    core_instances: u32,
    adapter_instances: u32,
    memories: u32,
    tables: u32,
}

impl Cost {
    fn add(&mut self, other: Cost) {
        self.core_instances = self.core_instances.saturating_add(other.core_instances);
        self.adapter_instances = self
            .adapter_instances
            .saturating_add(other.adapter_instances);
        self.memories = self.memories.saturating_add(other.memories);
        self.tables = self.tables.saturating_add(other.tables);
    }
}

/// A component being read: the cost of each entry of its core module and
/// component index spaces, and what its own instantiations add up to.
#[derive(Default)]
struct ComponentFrame {
    modules: Vec<Cost>,
    components: Vec<Cost>,
    total: Cost,
}

/// What is being read: a core module (its defined memories and tables so
/// far) or a component.
enum Frame {
    Module { memories: u32, tables: u32 },
    Component(ComponentFrame),
}

fn count(bytes: &[u8]) -> Result<Footprint, String> {
    if Parser::is_core_wasm(bytes) {
        return Err("a core module, not a component".into());
    }
    let mut footprint = Footprint {
        core_instances: 0,
        adapter_instances: 0,
        memories: 0,
        tables: 0,
        memories_per_module: 0,
        tables_per_module: 0,
        largest_memory_bytes: 0,
        largest_table_elements: 0,
    };
    let mut stack = vec![Frame::Component(ComponentFrame::default())];
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(|e| e.to_string())? {
            Payload::ModuleSection { .. } => stack.push(Frame::Module {
                memories: 0,
                tables: 0,
            }),
            Payload::ComponentSection { .. } => {
                stack.push(Frame::Component(ComponentFrame::default()))
            }
            Payload::MemorySection(section) => {
                let Some(Frame::Module { memories, .. }) = stack.last_mut() else {
                    return Err("a memory section outside a module".into());
                };
                for memory in section {
                    let memory = memory.map_err(|e| e.to_string())?;
                    *memories += 1;
                    let bytes = memory
                        .initial
                        .saturating_mul(1u64 << memory.page_size_log2());
                    footprint.largest_memory_bytes = footprint.largest_memory_bytes.max(bytes);
                }
            }
            Payload::TableSection(section) => {
                let Some(Frame::Module { tables, .. }) = stack.last_mut() else {
                    return Err("a table section outside a module".into());
                };
                for table in section {
                    let table = table.map_err(|e| e.to_string())?;
                    *tables += 1;
                    footprint.largest_table_elements =
                        footprint.largest_table_elements.max(table.ty.initial);
                }
            }
            Payload::InstanceSection(section) => {
                let frame = component(&mut stack)?;
                for instance in section {
                    if let Instance::Instantiate { module_index, .. } =
                        instance.map_err(|e| e.to_string())?
                    {
                        let cost = index(&frame.modules, module_index, "core module")?;
                        frame.total.add(cost);
                    }
                }
            }
            Payload::ComponentInstanceSection(section) => {
                let frame = component(&mut stack)?;
                for instance in section {
                    if let ComponentInstance::Instantiate {
                        component_index, ..
                    } = instance.map_err(|e| e.to_string())?
                    {
                        let cost = index(&frame.components, component_index, "component")?;
                        frame.total.add(cost);
                    }
                }
            }
            Payload::ComponentImportSection(section) => {
                let frame = component(&mut stack)?;
                for import in section {
                    let ComponentImport { ty, .. } = import.map_err(|e| e.to_string())?;
                    // An imported module or component is the host's to give,
                    // and no host gives one here: it costs nothing now, and
                    // linking refuses it later.
                    match ty {
                        ComponentTypeRef::Module(_) => frame.modules.push(Cost::default()),
                        ComponentTypeRef::Component(_) => frame.components.push(Cost::default()),
                        _ => {}
                    }
                }
            }
            Payload::ComponentCanonicalSection(section) => {
                let frame = component(&mut stack)?;
                for function in section {
                    if let CanonicalFunction::Lower { .. } = function.map_err(|e| e.to_string())? {
                        frame.total.adapter_instances =
                            frame.total.adapter_instances.saturating_add(1);
                    }
                }
            }
            Payload::ComponentAliasSection(section) => {
                for alias in section {
                    alias_into(&mut stack, alias.map_err(|e| e.to_string())?)?;
                }
            }
            Payload::ComponentExportSection(section) => {
                let frame = component(&mut stack)?;
                // An export is a new index of its sort, the same item.
                for export in section {
                    let export = export.map_err(|e| e.to_string())?;
                    match export.kind {
                        ComponentExternalKind::Module => {
                            let cost = index(&frame.modules, export.index, "core module")?;
                            frame.modules.push(cost);
                        }
                        ComponentExternalKind::Component => {
                            let cost = index(&frame.components, export.index, "component")?;
                            frame.components.push(cost);
                        }
                        _ => {}
                    }
                }
            }
            Payload::End(_) => {
                let ended = stack.pop().ok_or("more ends than beginnings")?;
                let Some(parent) = stack.last_mut() else {
                    // The outermost component: its instantiations are what
                    // one instance of it costs.
                    let Frame::Component(root) = ended else {
                        return Err("a core module, not a component".into());
                    };
                    footprint.core_instances = root.total.core_instances;
                    footprint.adapter_instances = root.total.adapter_instances;
                    footprint.memories = root.total.memories;
                    footprint.tables = root.total.tables;
                    return Ok(footprint);
                };
                let Frame::Component(parent) = parent else {
                    return Err("a module nested in a module".into());
                };
                match ended {
                    Frame::Module { memories, tables } => {
                        footprint.memories_per_module = footprint.memories_per_module.max(memories);
                        footprint.tables_per_module = footprint.tables_per_module.max(tables);
                        parent.modules.push(Cost {
                            core_instances: 1,
                            adapter_instances: 0,
                            memories,
                            tables,
                        });
                    }
                    Frame::Component(nested) => parent.components.push(nested.total),
                }
            }
            _ => {}
        }
    }
    Err("the component ends early".into())
}

/// The component being read, for a section only a component has.
fn component(stack: &mut [Frame]) -> Result<&mut ComponentFrame, String> {
    match stack.last_mut() {
        Some(Frame::Component(frame)) => Ok(frame),
        _ => Err("a component section inside a core module".into()),
    }
}

/// The cost of entry `at` of an index space.
fn index(space: &[Cost], at: u32, what: &str) -> Result<Cost, String> {
    space
        .get(at as usize)
        .copied()
        .ok_or_else(|| format!("{what} index {at} out of range"))
}

/// Add an alias's module or component to the current component's index
/// space: an outer one costs what it cost where it was defined; one taken
/// from an instance's exports was counted when that instance was made.
fn alias_into(stack: &mut [Frame], alias: ComponentAlias) -> Result<(), String> {
    let (outer, kind_is_module, index_at) = match alias {
        ComponentAlias::Outer {
            kind: ComponentOuterAliasKind::CoreModule,
            count,
            index,
        } => (Some(count), true, index),
        ComponentAlias::Outer {
            kind: ComponentOuterAliasKind::Component,
            count,
            index,
        } => (Some(count), false, index),
        ComponentAlias::InstanceExport {
            kind: ComponentExternalKind::Module,
            ..
        } => (None, true, 0),
        ComponentAlias::InstanceExport {
            kind: ComponentExternalKind::Component,
            ..
        } => (None, false, 0),
        _ => return Ok(()),
    };
    let cost = match outer {
        None => Cost::default(),
        Some(count) => {
            let depth = stack
                .len()
                .checked_sub(1 + count as usize)
                .ok_or("an outer alias beyond the outermost component")?;
            let Frame::Component(frame) = &stack[depth] else {
                return Err("an outer alias into a core module".into());
            };
            if kind_is_module {
                index(&frame.modules, index_at, "core module")?
            } else {
                index(&frame.components, index_at, "component")?
            }
        }
    };
    let frame = component(stack)?;
    if kind_is_module {
        frame.modules.push(cost);
    } else {
        frame.components.push(cost);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unsigned LEB128, as the binary format writes sizes and counts.
    fn leb(mut n: u32) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return out;
            }
            out.push(byte | 0x80);
        }
    }

    /// A section: its id, its size, its contents.
    fn section(id: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![id];
        out.extend(leb(contents.len() as u32));
        out.extend(contents);
        out
    }

    /// A component of one core module, defining one memory of `pages` pages
    /// and one table, instantiated `times` times: hand-assembled bytes, so
    /// the test needs no toolchain (component binary format: version 0x0d,
    /// layer 1; section 1 a core module, section 2 its core instances).
    fn component(pages: u32, times: u8) -> Vec<u8> {
        let mut module = vec![0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
        module.extend(section(4, &[0x01, 0x70, 0x00, 0x01])); // one funcref table of 1
        let mut memory = vec![0x01, 0x00]; // one memory, no maximum
        memory.extend(leb(pages));
        module.extend(section(5, &memory));
        let mut bytes = vec![0x00, 0x61, 0x73, 0x6d, 0x0d, 0x00, 0x01, 0x00];
        bytes.extend(section(1, &module));
        let mut instances = vec![times];
        for _ in 0..times {
            instances.extend([0x00, 0x00, 0x00]); // instantiate module 0, no args
        }
        bytes.extend(section(2, &instances));
        bytes
    }

    #[test]
    fn each_instantiation_of_a_module_counts_its_memories_and_tables() {
        let footprint = Footprint::of(&component(1, 3)).unwrap();
        assert_eq!(footprint.core_instances, 3);
        assert_eq!(footprint.memories, 3);
        assert_eq!(footprint.tables, 3);
        assert_eq!(footprint.memories_per_module, 1);
        assert_eq!(footprint.tables_per_module, 1);
        assert_eq!(footprint.largest_memory_bytes, 64 << 10);
        assert_eq!(footprint.largest_table_elements, 1);
        assert!(footprint.check().is_ok());
    }

    #[test]
    fn a_memory_that_starts_above_the_limit_is_refused_with_its_size() {
        // 1024 pages of 64 KiB are exactly the limit; one more is over it.
        assert!(Footprint::of(&component(1024, 1)).unwrap().check().is_ok());
        let footprint = Footprint::of(&component(1025, 1)).unwrap();
        assert_eq!(footprint.largest_memory_bytes, 1025 * (64 << 10));
        let refused = footprint.check().unwrap_err().to_string();
        assert!(refused.contains("starts at 65 MiB"), "{refused}");
        assert!(refused.contains("64 MiB"), "{refused}");
    }

    #[test]
    fn coord_serve_refuses_at_start_a_function_whose_memory_cannot_fit() {
        let backend = std::sync::Arc::new(coord_host::backend::memory::MemoryBackend::default());
        let Err(refused) = crate::Server::with_capacity(&component(1025, 1), backend, 4) else {
            panic!("a function whose memory starts at 65 MiB was accepted");
        };
        let refused = format!("{refused:#}");
        assert!(refused.contains("starts at 65 MiB"), "{refused}");
    }

    #[test]
    fn bytes_that_are_not_a_component_are_an_error_not_a_count() {
        assert!(Footprint::of(b"not wasm").is_err());
        let module_alone = [0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00];
        let error = Footprint::of(&module_alone).unwrap_err().to_string();
        assert!(error.contains("not a component"), "{error}");
    }
}
